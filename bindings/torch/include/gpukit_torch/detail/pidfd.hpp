// SPDX-License-Identifier: Apache-2.0
// gpukit_torch/detail/pidfd.hpp: how a process takes another process's descriptors (the pages of
// a growable block, in PyTorch's expandable-segment handles): pidfd_open(pid) and
// pidfd_getfd(pidfd, fd), Linux 5.6 and later, allowed when the caller may ptrace-attach the other
// process (same user; Yama's ptrace_scope and containers may forbid it). Not public API.
//
// The calls go through a table that tests replace (pidfd_syscalls()), so that every refusal can be
// simulated on any machine; GPUKIT_TORCH_REFUSE_PIDFD_GETFD=EPERM (or ENOSYS, ESRCH, EBADF, or a
// number) makes every pidfd_getfd of the real table fail with that errno, so that a whole program
// (torch.multiprocessing, the compatibility table) can be run as on a machine that refuses.
//
// A sender learns early whether receivers will be refused: probe_pidfd_getfd() forks a child that
// takes one of the parent's descriptors, as a receiver would (a process that is not its
// ancestor: what Yama's default ptrace_scope forbids).
#pragma once

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434  // the same number on every architecture (unified syscall table)
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace gpukit_torch::detail {

/// The variable that makes pidfd_getfd fail, for tests (see the top of this header).
inline constexpr char const* pidfd_refuse_variable = "GPUKIT_TORCH_REFUSE_PIDFD_GETFD";

/// The setting that avoids sharing growable memory (and so these calls) altogether.
inline constexpr char const* pidfd_avoiding_setting = "GPUKIT_ALLOC_CONF=segments:synchronous";

/// The errno `name` spells ("EPERM", "ENOSYS", "ESRCH", "EBADF", or a positive number); 0 for
/// anything else.
inline int errno_from_name(char const* name)
{
  if (name == nullptr || *name == '\0') { return 0; }
  struct known {
    char const* name;
    int value;
  };
  static constexpr known names[] = {{"EPERM", EPERM}, {"ENOSYS", ENOSYS}, {"ESRCH", ESRCH},
                                    {"EBADF", EBADF}, {"EACCES", EACCES}, {"EMFILE", EMFILE}};
  for (auto const& k : names) {
    if (std::strcmp(k.name, name) == 0) { return k.value; }
  }
  char* end         = nullptr;
  long const number = std::strtol(name, &end, 10);
  return *end == '\0' && number > 0 && number < 4096 ? static_cast<int>(number) : 0;
}

/// The errno GPUKIT_TORCH_REFUSE_PIDFD_GETFD asks for (0: none), read once per process.
inline int refused_getfd_errno()
{
  static int const error = errno_from_name(std::getenv(pidfd_refuse_variable));
  return error;
}

/// The system calls, each returning a descriptor, or -1 with errno set.
struct pidfd_calls {
  int (*open)(int pid);             ///< pidfd_open(pid, 0)
  int (*getfd)(int pidfd, int fd);  ///< pidfd_getfd(pidfd, fd, 0): a copy of the target's fd
};

inline int system_pidfd_open(int pid)
{
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

inline int system_pidfd_getfd(int pidfd, int fd)
{
  if (int const refused = refused_getfd_errno(); refused != 0) {
    errno = refused;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
}

/// The calls in use, process-wide: the system's unless a test replaced them.
inline pidfd_calls& pidfd_syscalls()
{
  static pidfd_calls calls{&system_pidfd_open, &system_pidfd_getfd};
  return calls;
}

/// Why pidfd_open or pidfd_getfd failed with `error`.
inline std::string pidfd_cause(int error)
{
  switch (error) {
    case ENOSYS:
      return "the kernel lacks it (ENOSYS: pidfd_open and pidfd_getfd need Linux 5.6 or later; a "
             "seccomp filter, as some container runtimes install, may also hide them), so "
             "growable memory cannot be shared between processes here";
    case EPERM:
      return "not permitted (EPERM): the receiving process may not ptrace-attach the sender "
             "(/proc/sys/kernel/yama/ptrace_scope above 0, or a container without "
             "CAP_SYS_PTRACE), so growable memory cannot be shared between processes here";
    case ESRCH:
      return "no such process (ESRCH): the sender exited before the receiver opened its tensor; "
             "keep the sending process alive until the receivers have opened what it sent";
    case EBADF:
      return "the sender has no such descriptor (EBADF): it freed the tensor's memory (its pages "
             "were unmapped and their descriptors closed) before the receiver opened it; keep "
             "the tensor alive in the sender until the receivers have opened it";
    default: return "errno " + std::to_string(error) + " (" + std::strerror(error) + ")";
  }
}

/// What avoids the calls, closing every refusal's message.
inline std::string pidfd_advice()
{
  return std::string{". Setting "} + pidfd_avoiding_setting +
         " shares tensors through CUDA IPC handles instead, without these calls";
}

/// Why `call` ("pidfd_open" or "pidfd_getfd") failed with `error` when taking descriptor `fd` of
/// process `pid`, and what avoids it.
inline std::string pidfd_refusal(char const* call, int error, int pid, int fd)
{
  bool const getfd = std::strcmp(call, "pidfd_getfd") == 0;
  return "gpukit: " + std::string{call} + "(process " + std::to_string(pid) +
         (getfd ? ", fd " + std::to_string(fd) : std::string{}) +
         ") failed: " + pidfd_cause(error) + pidfd_advice();
}

/// A copy, in this process, of process `pid`'s descriptor `fd` (through `pidfd`, from
/// pidfd_syscalls().open(pid)); the caller closes it.
/// @throws std::system_error with the errno and pidfd_refusal's message when refused
inline int take_descriptor(int pid, int pidfd, int fd)
{
  int const got = pidfd_syscalls().getfd(pidfd, fd);
  if (got < 0) {
    int const error = errno;
    throw std::system_error{error, std::generic_category(),
                            pidfd_refusal("pidfd_getfd", error, pid, fd)};
  }
  return got;
}

/// A descriptor of process `pid` (pidfd_open); the caller closes it.
/// @throws std::system_error with the errno and pidfd_refusal's message when refused
inline int open_process(int pid)
{
  int const got = pidfd_syscalls().open(pid);
  if (got < 0) {
    int const error = errno;
    throw std::system_error{error, std::generic_category(),
                            pidfd_refusal("pidfd_open", error, pid, -1)};
  }
  return got;
}

/// What probe_pidfd_getfd found: error 0 when a receiver may take this process's descriptors,
/// else the errno of `call`.
struct pidfd_probe {
  int error{0};
  char const* call{""};
  /// The refusal's message ("" when allowed).
  [[nodiscard]] std::string message() const
  {
    if (error == 0) { return {}; }
    return "gpukit: this tensor's memory cannot be shared with another process: a process "
           "receiving it could not take its pages' descriptors (" +
           std::string{call} +
           " failed when a child process tried it on this one): " + pidfd_cause(error) +
           pidfd_advice();
  }
};

/// Whether another process can take this process's descriptors: a fork()ed child calls
/// pidfd_open(parent) and pidfd_getfd on a descriptor of the parent, through pidfd_syscalls(),
/// and reports the errno. A fork that fails, or a child that reports nothing, counts as allowed
/// (the receiver then reports whatever refusal it meets). Blocks for the child (about a
/// millisecond). The child makes system calls only, so forking a process with threads is safe.
inline pidfd_probe probe_pidfd_getfd()
{
  pidfd_calls const calls = pidfd_syscalls();
  (void)refused_getfd_errno();  // read the environment here: the child only makes system calls
  int fds[2];
  if (::pipe(fds) != 0) { return {}; }
  pid_t const parent = ::getpid();
  pid_t const child  = ::fork();
  if (child == 0) {
    int report[2]   = {0, 0};  // errno, and which call (1: pidfd_open, 2: pidfd_getfd)
    int const pidfd = calls.open(static_cast<int>(parent));
    if (pidfd < 0) {
      report[0] = errno;
      report[1] = 1;
    } else {
      int const got = calls.getfd(pidfd, fds[0]);  // the parent's read end
      if (got < 0) {
        report[0] = errno;
        report[1] = 2;
      } else {
        ::close(got);
      }
      ::close(pidfd);
    }
    (void)!::write(fds[1], report, sizeof report);
    ::_exit(0);
  }
  ::close(fds[1]);
  pidfd_probe out;
  if (child > 0) {
    int report[2] = {0, 0};
    ssize_t n     = 0;
    do {
      n = ::read(fds[0], report, sizeof report);
    } while (n < 0 && errno == EINTR);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {}
    if (n == static_cast<ssize_t>(sizeof report) && report[0] != 0) {
      out.error = report[0];
      out.call  = report[1] == 1 ? "pidfd_open" : "pidfd_getfd";
    }
  }
  ::close(fds[0]);
  return out;
}

}  // namespace gpukit_torch::detail
