// A user's own LibTorch loop made distributed with libmuster: a small MLP
// learns y = sum(x) on synthetic data. Start a coordinator, then run one or
// more copies of this program:
//
//   muster-coordinator --listen 127.0.0.1:29400 --no-auth --min-members 2 &
//   MUSTER_COORDINATOR=127.0.0.1:29400 ./muster_example --node-id a &
//   MUSTER_COORDINATOR=127.0.0.1:29400 ./muster_example --node-id b
#include <muster/muster.h>
#include <torch/torch.h>

#include <cstring>
#include <iostream>

int main(int argc, char** argv) {
  muster::Options options;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--node-id") == 0) options.node_id = argv[i + 1];
  }
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
  auto dist = muster::Distributed::Start(*model, options);
  if (!dist.ok()) {
    std::cerr << "example: " << dist.status() << "\n";
    return 1;
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const torch::Tensor x_all = torch::rand({4096, 8});
  const torch::Tensor y_all = x_all.sum(1, /*keepdim=*/true);
  double loss_value = 0;
  for (int step = 0; step < 200; ++step) {
    std::vector<int64_t> idx = (*dist)->NextBatch(4096, 32, /*seed=*/7);
    torch::Tensor i = torch::tensor(idx, torch::kInt64);
    torch::Tensor loss = torch::mse_loss(model->forward(x_all.index_select(0, i)),
                                         y_all.index_select(0, i));
    optimizer.zero_grad();
    (*dist)->BeforeBackward();
    loss.backward();
    if (absl::Status s = (*dist)->AfterBackward(); !s.ok()) {
      std::cerr << "example: step dropped: " << s << "\n";
      return 1;
    }
    optimizer.step();
    loss_value = loss.item<double>();
  }
  auto mean = (*dist)->Average({loss_value});
  if (!mean.ok()) return 1;
  if ((*dist)->rank() == 0) {
    std::cout << "example: world " << (*dist)->world_size() << ", final loss " << (*mean)[0]
              << std::endl;
  }
  return (*dist)->Finish().ok() && (*mean)[0] < 0.05 ? 0 : 1;
}
