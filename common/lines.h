// Lines for people: what a program shows its user (muster's world line,
// progress lines, a resume, a leave, a stop), one call per line, without the
// newline. Library code writes through a sink the program chose
// (muster::Options::output); this is the sink used when it chose none.
//
// Thread-safety: StandardOutput's sink may be called from any thread; lines
// from two threads do not interleave within a line.
#ifndef MUSTER_COMMON_LINES_H_
#define MUSTER_COMMON_LINES_H_

#include <functional>
#include <string_view>

namespace muster {

using LineSink = std::function<void(std::string_view line)>;

// Writes each line to standard output with a newline, and flushes it.
LineSink StandardOutput();

}  // namespace muster

#endif  // MUSTER_COMMON_LINES_H_
