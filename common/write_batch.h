// WriteBatch: a thread's burst of writes to streams, sent as one message
// per stream. A regroup announces a generation to every member of the old
// world and a completed world answers every member's rendezvous, all from
// one thread, one message per member; a node session carries eight or more
// members, so most of those messages go to the same stream one after the
// other. Each written message costs a completion in gRPC, and at 100,000
// members the completions are where a regroup's time goes (docs/scale.md).
// Inside a WriteBatch a stream that can merge (rpc/write_queue.h) holds its
// writes back, and when the outermost WriteBatch of the thread ends, each
// such stream writes what it holds as one merged message.
//
// Coordinator::Actions runs its actions inside one, so everything a
// decision announces leaves as one write per stream. A WriteBatch must not
// wait for a write it holds back: the writes start when it ends.
//
// Not thread-safe: a WriteBatch belongs to the thread that made it.
#ifndef MUSTER_COMMON_WRITE_BATCH_H_
#define MUSTER_COMMON_WRITE_BATCH_H_

#include <vector>

namespace muster {

// A stream's writer that can hold writes back and send them later.
class HeldWrites {
 public:
  // Sends what was held since Hold returned true.
  virtual void Flush() = 0;

 protected:
  ~HeldWrites() = default;
};

class WriteBatch {
 public:
  WriteBatch();
  ~WriteBatch();  // the outermost one flushes, in the order streams first held
  WriteBatch(const WriteBatch&) = delete;
  WriteBatch& operator=(const WriteBatch&) = delete;

  // Inside a WriteBatch on this thread: remembers `writer` (once per
  // batch) and returns true; the writer then holds its writes until
  // Flush. Outside one: false, write now.
  static bool Hold(HeldWrites* writer);

 private:
  WriteBatch* outer_;
  std::vector<HeldWrites*> held_;  // the outermost batch's
};

}  // namespace muster

#endif  // MUSTER_COMMON_WRITE_BATCH_H_
