#include "common/write_batch.h"

namespace muster {
namespace {

thread_local WriteBatch* current = nullptr;

}  // namespace

WriteBatch::WriteBatch() : outer_(current) {
  if (outer_ == nullptr) current = this;
}

WriteBatch::~WriteBatch() {
  if (outer_ != nullptr) return;
  // A writer flushed here may write again (another message queued meanwhile
  // goes out with the merged one or after it); nothing is held any more.
  current = nullptr;
  for (HeldWrites* w : held_) w->Flush();
}

bool WriteBatch::Hold(HeldWrites* writer) {
  if (current == nullptr) return false;
  current->held_.push_back(writer);
  return true;
}

}  // namespace muster
