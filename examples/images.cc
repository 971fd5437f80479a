// An image classifier whose examples cost CPU time to load, as JPEG decoding
// and augmentation do, made elastic with libmuster: muster::DataLoader's
// worker threads fetch this rank's examples, and the next step's while this
// one trains, the way DDP programs use torch.utils.data.DataLoader with
// num_workers.
//
//   images [--workers N] [--steps-ahead N] [--decode-us N] [--epochs N | --steps N] [--batch N]
//          [--checkpoint-dir D --checkpoint-every N] [--log-dir D]
//          [--record DIR] [--summary FILE] [--pace-ms N]
//          [--kill-rank R --kill-at-step N]
//
// Example i is a 3x32x32 image drawn from a generator seeded by i, of class
// i % 10; loading it takes --decode-us microseconds of CPU (default 2000,
// on the loading thread's CPU clock), and it is normalized by a transform
// mapped over the dataset, as LibTorch programs write it.
// --record DIR writes DIR/<pid>.txt with "epoch index" for every example
// this process trained on in a step that counted, the index read from the
// example the loader delivered; --summary FILE writes the final state
// digest and the loader's counts ({pid} in FILE is replaced). With
// --kill-rank R --kill-at-step N, rank R SIGKILLs itself inside step N,
// after its backward and before AfterBackward: a crash while the loader
// fetches the next step ahead (the process tests' drill).
#include <muster/data.h>
#include <muster/muster.h>
#include <torch/torch.h>
#include <time.h>
#include <unistd.h>

#include <csignal>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>

namespace {

constexpr int64_t kExamples = 2048, kClasses = 10;

int64_t ThreadCpuNs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

// The target holds the class and the example's own index.
class SyntheticImages : public torch::data::datasets::Dataset<SyntheticImages> {
 public:
  explicit SyntheticImages(int decode_us) : decode_us_(decode_us) {}
  torch::data::Example<> get(size_t index) override {
    const int64_t until = ThreadCpuNs() + int64_t{decode_us_} * 1000;
    torch::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(index) + 7);
    const int64_t label = static_cast<int64_t>(index) % kClasses;
    torch::Tensor image = torch::randn({3, 32, 32}, gen) * 0.5 + static_cast<double>(label) / 5;
    // The decoder's CPU time, counted on this thread's own clock (a wall
    // clock would count the time other threads took from it); the image
    // stays as drawn.
    for (torch::Tensor work = image; ThreadCpuNs() < until;) work = work.flip(2);
    return {image, torch::tensor({label, static_cast<int64_t>(index)})};
  }
  torch::optional<size_t> size() const override { return kExamples; }

 private:
  int decode_us_;
};

std::string Flag(const std::map<std::string, std::string>& flag, const std::string& name,
                 const std::string& fallback) {
  auto it = flag.find(name);
  return it == flag.end() ? fallback : it->second;
}

std::string WithPid(std::string path) {
  if (auto at = path.find("{pid}"); at != std::string::npos) {
    path.replace(at, 5, std::to_string(::getpid()));
  }
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flag;
  for (int i = 1; i + 1 < argc; i += 2) flag[argv[i]] = argv[i + 1];
  torch::set_num_threads(1);  // bit-identical runs: one reduction order
  torch::manual_seed(0);
  torch::nn::Sequential model(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)), torch::nn::ReLU(),
      torch::nn::MaxPool2d(2), torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)),
      torch::nn::ReLU(), torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten(),
      torch::nn::Linear(32, kClasses));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  muster::Options options;
  options.dataset_size = kExamples;
  options.batch_per_rank = std::stoi(Flag(flag, "--batch", "16"));
  options.steps = std::stoll(Flag(flag, "--steps", "0"));
  options.epochs = options.steps > 0 ? 0 : std::stoll(Flag(flag, "--epochs", "1"));
  options.checkpoint_dir = Flag(flag, "--checkpoint-dir", "");
  options.checkpoint_every = std::stoll(Flag(flag, "--checkpoint-every", "0"));
  options.log_dir = Flag(flag, "--log-dir", "");
  options.log_every = 10;
  options.model_name = "images";
  // One thread for the model's ops: the loader's workers need the other
  // cores (muster would otherwise share them all out to the model).
  options.intra_op_threads = 1;
  muster::State state;
  state.model = model.ptr().get();
  state.optimizer = &optimizer;
  auto job = muster::Distributed::Start(options, state);
  if (!job.ok()) {
    std::cerr << "images: " << job.status() << "\n";
    return muster::Distributed::ExitCode(job.status());
  }
  muster::Distributed& d = **job;
  auto images = SyntheticImages(std::stoi(Flag(flag, "--decode-us", "2000")))
                    .map(torch::data::transforms::Normalize<>({0.9, 0.9, 0.9}, {0.76, 0.76, 0.76}));
  muster::DataLoader loader(d, std::move(images), std::stoi(Flag(flag, "--workers", "4")),
                            std::stoi(Flag(flag, "--steps-ahead", "2")));
  std::ofstream record;
  if (flag.count("--record")) record.open(flag["--record"] + "/" + std::to_string(::getpid()) + ".txt");
  const int pace_ms = std::stoi(Flag(flag, "--pace-ms", "0"));
  const int kill_rank = std::stoi(Flag(flag, "--kill-rank", "-1"));
  const int64_t kill_at_step = std::stoll(Flag(flag, "--kill-at-step", "-1"));
  while (!d.ShouldStop()) {
    const int64_t epoch = d.epoch();
    std::vector<torch::data::Example<>> examples = loader.Batch();
    optimizer.zero_grad();
    d.BeforeBackward();
    torch::Tensor targets;
    if (!examples.empty()) {
      const torch::data::Example<> batch = torch::data::transforms::Stack<>().apply_batch(examples);
      targets = batch.target;
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(batch.data),
                                                                batch.target.select(1, 0),
                                                                torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
                           options.batch_per_rank;
      loss.backward();
      if (d.rank() == kill_rank && d.step() == kill_at_step) std::raise(SIGKILL);
      d.RecordLoss(loss.item<double>() * options.batch_per_rank / examples.size());
    }
    if (!d.AfterBackward().ok()) continue;  // a peer failed and the step could not be salvaged
    optimizer.step();
    // The examples of a step that counted (a salvage empties Batch() when
    // this rank's share did not).
    if (targets.defined() && !d.Batch().empty()) {
      for (int64_t k = 0; k < targets.size(0); ++k) {
        record << epoch << " " << targets[k][1].item<int64_t>() << "\n";
      }
      record.flush();
    }
    if (pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
  }
  absl::StatusOr<muster::Distributed::Outcome> outcome = d.Finish();
  if (flag.count("--summary")) {
    char digest[17];
    std::snprintf(digest, sizeof digest, "%016llx",
                  static_cast<unsigned long long>(d.StateDigest()));
    std::ofstream(WithPid(flag["--summary"]))
        << "{\"rank\": " << d.rank() << ", \"world_size\": " << d.world_size()
        << ", \"steps\": " << d.step() << ", \"digest\": \"" << digest
        << "\", \"fetched_ahead\": " << loader.fetched_ahead()
        << ", \"dropped_ahead\": " << loader.dropped_ahead() << "}\n";
  }
  std::cout << "images: rank " << d.rank() << " of " << d.world_size() << ", step " << d.step()
            << ", " << loader.fetched_ahead() << " examples fetched ahead" << std::endl;
  return muster::Distributed::ExitCode(outcome);
}
