// Your own model on Fashion-MNIST, made elastic with libmuster: a small
// two-layer network, plain LibTorch otherwise. Run a coordinator, then one
// copy of this program per slot (or under muster-agent):
//
//   muster-coordinator --listen 127.0.0.1:29400 --no-auth --min-members 2 &
//   MUSTER_COORDINATOR=127.0.0.1:29400 ./fashion_mnist --node-id a &
//   MUSTER_COORDINATOR=127.0.0.1:29400 ./fashion_mnist --node-id b
#include <muster/muster.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

namespace {

// An IDX file (gzip-compressed, as Debian's dataset-fashion-mnist ships it)
// as a uint8 tensor of its dimensions.
torch::Tensor ReadIdx(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  unsigned char head[4];
  gzread(f, head, 4);
  std::vector<int64_t> dims(head[3]);
  for (int64_t& d : dims) {
    unsigned char b[4];
    gzread(f, b, 4);
    d = (int64_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3];
  }
  torch::Tensor t = torch::empty(dims, torch::kUInt8);
  const int got = gzread(f, t.data_ptr(), static_cast<unsigned>(t.numel()));
  gzclose(f);
  if (got != t.numel()) throw std::runtime_error(path + " is truncated");
  return t;
}

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(784, 128));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x.flatten(1)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  muster::Options options;
  std::string dir = "/usr/share/datasets/fashion-mnist";
  std::string summary;  // a file for the final state digest, {pid} replaced
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--node-id") options.node_id = value;
    if (flag == "--data-dir") dir = value;
    if (flag == "--steps") options.steps = std::stoll(value);
    if (flag == "--checkpoint-dir") options.checkpoint_dir = value;
    if (flag == "--summary") summary = value;
  }
  const torch::Tensor images = ReadIdx(dir + "/train-images-idx3-ubyte.gz").to(torch::kFloat32) / 255;
  const torch::Tensor labels = ReadIdx(dir + "/train-labels-idx1-ubyte.gz").to(torch::kInt64);

  torch::manual_seed(0);  // the same initial model everywhere (rank 0's wins anyway)
  auto model = std::make_shared<Net>();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  options.dataset_size = images.size(0);
  options.batch_per_rank = 64;
  options.epochs = 1;
  options.checkpoint_every = 200;
  options.model_name = "fashion-mlp";
  muster::State state;
  state.model = model.get();
  state.optimizer = &optimizer;
  auto job = muster::Distributed::Start(options, state);
  if (!job.ok()) {
    std::cerr << "fashion_mnist: " << job.status() << "\n";
    return muster::Distributed::ExitCode(job.status());  // 78 for bad options: not restarted
  }
  muster::Distributed& d = **job;
  double last_loss = 0;
  while (!d.ShouldStop()) {
    const torch::Tensor idx = torch::tensor(d.Batch(), torch::kInt64);
    torch::Tensor loss = torch::cross_entropy_loss(model->forward(images.index_select(0, idx)),
                                                   labels.index_select(0, idx));
    optimizer.zero_grad();
    d.BeforeBackward();
    loss.backward();
    if (!d.AfterBackward().ok()) continue;  // a peer failed and the step could not be salvaged
    optimizer.step();
    last_loss = loss.item<double>();
    d.RecordLoss(last_loss);
  }
  if (d.finished()) {
    auto sum = d.AllReduceSum({last_loss});  // the mean over ranks of the last loss
    if (sum.ok() && d.rank() == 0) {
      std::cout << "fashion_mnist: world " << d.world_size() << ", " << d.step()
                << " steps, final loss " << (*sum)[0] / d.world_size() << std::endl;
    }
  }
  absl::StatusOr<muster::Distributed::Outcome> outcome = d.Finish();
  if (!summary.empty()) {
    if (const size_t at = summary.find("{pid}"); at != std::string::npos) {
      summary.replace(at, 5, std::to_string(::getpid()));
    }
    std::ofstream(summary) << "{\"rank\": " << d.rank() << ", \"steps\": " << d.step()
                           << ", \"digest\": \"" << std::hex << d.StateDigest() << std::dec
                           << "\"}\n";
  }
  return muster::Distributed::ExitCode(outcome);
}
