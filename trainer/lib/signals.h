// The flags muster's SIGUSR1/SIGTERM handlers set (include/muster/signals.h
// installs them), and a trainer's requests to stop or leave, which include
// them. Only the engine reads them.
#ifndef MUSTER_TRAINER_LIB_SIGNALS_H_
#define MUSTER_TRAINER_LIB_SIGNALS_H_

#include <atomic>

namespace muster {

// SIGUSR1 came (stop: checkpoint, exit 75).
const std::atomic<bool>& StopSignalled();
// SIGTERM came (leave; at every rank at once, a stop).
const std::atomic<bool>& LeaveSignalled();

// What the program and the signals ask of one trainer: to stop or to leave,
// and what the program asks of the job: to finish. Asked from any thread
// (signal handlers too); read by the engine.
class StopRequests {
 public:
  // `stop`, `leave`: the program's flags (Options::stop_requested,
  // leave_requested); null: the signal handlers' flags when `signals`.
  StopRequests(const std::atomic<bool>* stop, const std::atomic<bool>* leave, bool signals)
      : stop_flag_(stop != nullptr ? stop : signals ? &StopSignalled() : nullptr),
        leave_flag_(leave != nullptr ? leave : signals ? &LeaveSignalled() : nullptr) {}

  void RequestStop() { stop_ = true; }
  void RequestLeave() { leave_ = true; }
  void RequestFinish() { finish_ = true; }
  bool stop() const { return stop_.load() || (stop_flag_ != nullptr && stop_flag_->load()); }
  bool leave() const { return leave_.load() || (leave_flag_ != nullptr && leave_flag_->load()); }
  bool finish() const { return finish_.load(); }

 private:
  const std::atomic<bool>* const stop_flag_;
  const std::atomic<bool>* const leave_flag_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> leave_{false};
  std::atomic<bool> finish_{false};
};

}  // namespace muster

#endif  // MUSTER_TRAINER_LIB_SIGNALS_H_
