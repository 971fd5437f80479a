// muster/amp.h on its own: the autocast scope and the loss scaler's
// arithmetic and state (the world's verdict: train_test.cc, GradScalerTest).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "muster/amp.h"

namespace muster {
namespace {

// bf16 autocast on the CPU, as a program's forward uses it: a linear layer
// computes in bfloat16 inside the scope, in float32 after it, and a nested
// scope that turns autocast off leaves the outer one on when it ends.
TEST(AutocastTest, ALinearRunsInBfloat16InsideTheScopeAndInFloat32After) {
  torch::nn::Linear linear(8, 4);
  const torch::Tensor x = torch::randn({2, 8});
  {
    Autocast autocast(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);
    {
      Autocast off(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
      EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16) << "disabled changes nothing";
    }
    EXPECT_EQ(linear(x).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(linear(x).scalar_type(), torch::kFloat32);
}

// Unregistered, the scaler works as torch.amp.GradScaler: the gradients of
// a scaled loss come back to their true size, a step whose gradients hold
// an inf is skipped and halves the scale, growth_interval good steps double
// it. Its state round-trips through its blob; bytes that are no state are
// refused by name.
TEST(GradScalerTest, UnscalesSkipsBacksOffGrowsAndCarriesItsState) {
  GradScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 2;
  GradScaler scaler(o);
  torch::Tensor w = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.5));
  auto pass = [&](double poison) {
    sgd.zero_grad();
    scaler.scale((w * torch::tensor({1.0f, 2.0f, 3.0f})).sum() * poison).backward();
    scaler.unscale_(sgd);
    scaler.unscale_(sgd);  // once per step: the second does nothing
    const bool stepped = scaler.step(sgd);
    scaler.update();
    return stepped;
  };
  EXPECT_TRUE(pass(1.0));
  EXPECT_TRUE(torch::equal(w.grad(), torch::tensor({1.0f, 2.0f, 3.0f})));
  EXPECT_TRUE(torch::equal(w.detach(), torch::tensor({0.5f, 0.0f, -0.5f})));
  EXPECT_EQ(scaler.get_scale(), 1024);
  EXPECT_EQ(scaler.growth_tracker(), 1);
  EXPECT_TRUE(pass(1.0));
  EXPECT_EQ(scaler.get_scale(), 2048);
  EXPECT_FALSE(pass(std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(torch::equal(w.detach(), torch::tensor({0.0f, -1.0f, -2.0f}))) << "stepped on inf";
  EXPECT_EQ(scaler.get_scale(), 1024);
  EXPECT_EQ(scaler.skipped_steps(), 1);

  Blob blob = scaler.StateBlob();
  EXPECT_EQ(blob.name, "grad_scaler");
  const std::string saved = blob.save();
  GradScaler other(o);
  Blob into = other.StateBlob();
  ASSERT_TRUE(into.load(saved).ok());
  EXPECT_EQ(other.get_scale(), 1024);
  EXPECT_EQ(other.skipped_steps(), 1);
  EXPECT_EQ(into.save(), saved);
  for (const std::string bad : {"", "0x1p+10 -1 0", "-0x1p+10 0 0", "inf 0 0", "1024"}) {
    const absl::Status s = into.load(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << "'" << bad << "': " << s;
    EXPECT_NE(s.message().find("grad_scaler"), std::string::npos) << s;
  }
  EXPECT_EQ(other.get_scale(), 1024) << "a refused load changed the state";
}

}  // namespace
}  // namespace muster
