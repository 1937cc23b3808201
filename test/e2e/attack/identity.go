package main

import (
	"fmt"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"
)

// Identity attacks: ways to make a connection look as if another process
// (one a policy binds) had opened it.

func init() {
	attacks["pidfd-getfd-sibling"] = cmdPidfdGetfdSibling
	attacks["proc-mem-sibling"] = cmdProcMemSibling
}

// cmdProcMemSibling opens another process's memory for writing through
// /proc/PID/mem, which needs no ptrace syscall: code written there would
// run as that process, an allowed binary, say.
func cmdProcMemSibling([]string) int {
	child := exec.Command("/proc/self/exe", "sleep", "30")
	if err := child.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start child:", err)
		return exitUsage
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", child.Process.Pid), os.O_RDWR, 0)
	if err != nil {
		return blocked("open /proc/%d/mem for writing: %s", child.Process.Pid, errno(err))
	}
	f.Close()
	return escaped("opened sibling %d's memory for writing", child.Process.Pid)
}

// cmdPidfdGetfdSibling takes a descriptor out of another process with
// pidfd_getfd(2). Had the sibling been an allowed binary holding a
// connected socket, the taker would speak through it under the sibling's
// identity.
func cmdPidfdGetfdSibling([]string) int {
	child := exec.Command("/proc/self/exe", "sleep", "30")
	if err := child.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start child:", err)
		return exitUsage
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	pidfd, err := unix.PidfdOpen(child.Process.Pid, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pidfd_open:", err)
		return exitUsage
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, 1, 0)
	if err != nil {
		return blocked("pidfd_getfd of sibling %d: %s", child.Process.Pid, errno(err))
	}
	unix.Close(fd)
	return escaped("took descriptor 1 of sibling %d as %d", child.Process.Pid, fd)
}
