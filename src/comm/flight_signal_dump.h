// The flight recorder's fatal-signal path (comm/flight_recorder.h), apart from the ring: the file
// paths and the handlers are set up at configure time, so that the handler itself only formats
// integers and strings into a preallocated buffer and hands it to write(2) (signal-safety(7)).
#pragma once
#include <string>

namespace shardlm::comm {
class FlightRecorder;

namespace flight_signal {
// Preformats <dir>/rank<R>.json and its temporary name for the handler; dir empty: no file.
void set_paths(const std::string& dir, int world_rank);
// Installs the fatal-signal handlers (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT; on an alternate
// stack, so that a stack overflow of the calling thread is recorded too) and SIGUSR2's, which
// sets the flag usr2_pending() reads. Once per process.
void install_handlers(const FlightRecorder* recorder);
// True once after each SIGUSR2.
bool take_usr2();
// "fatal signal 11 (Segmentation fault)" into buf, by hand (strsignal is not async-signal-safe).
void fatal_reason(int sig, char* buf, unsigned long size);
}  // namespace flight_signal
}  // namespace shardlm::comm
