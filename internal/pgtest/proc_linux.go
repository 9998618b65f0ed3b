package pgtest

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// serverProcAttr runs a server binary as cred (nil: as this process) in its own process group,
// so that a terminal's Ctrl-C reaches only this process, which then stops the server. The
// server gets SIGQUIT (immediate shutdown) if this process dies.
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
}

// procStat is the part of /proc/PID/stat this package reads.
type procStat struct {
	pid   int
	ppid  int
	comm  string
	state byte
}

// readStat reads /proc/PID/stat.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	fields := strings.Fields(s[end+1:])
	if len(fields) < 2 || len(fields[0]) != 1 {
		return procStat{}, false
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return procStat{}, false
	}
	return procStat{pid: pid, ppid: ppid, comm: s[open+1 : end], state: fields[0][0]}, true
}

// processes lists every process in /proc.
func processes() []procStat {
	entries, _ := os.ReadDir("/proc")
	var ps []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			ps = append(ps, st)
		}
	}
	return ps
}

// childrenOf returns the pids of the children of pid.
func childrenOf(pid int) []int {
	var pids []int
	for _, p := range processes() {
		if p.ppid == pid {
			pids = append(pids, p.pid)
		}
	}
	return pids
}

// orphans returns the postgres processes that are children of this process (the postmasters
// this process runs among them).
func orphans() []int {
	var pids []int
	self := os.Getpid()
	for _, p := range processes() {
		if p.ppid == self && p.comm == "postgres" {
			pids = append(pids, p.pid)
		}
	}
	return pids
}

// isChild reports whether pid is a child of this process.
func isChild(pid int) bool {
	st, ok := readStat(pid)
	return ok && st.ppid == os.Getpid()
}

// gone reports whether pid has exited (a zombie counts: nothing is left to wait for).
func gone(pid int) bool {
	st, ok := readStat(pid)
	return !ok || st.state == 'Z' || st.state == 'X'
}

const (
	prSetChildSubreaper = 36
	prGetChildSubreaper = 37
)

// becomeSubreaper makes orphaned descendants of this process its children, so that it can reap
// them (a container's init may never do so), and returns a function undoing it.
func becomeSubreaper() (restore func()) {
	var was int32
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prGetChildSubreaper, uintptr(unsafe.Pointer(&was)), 0); errno != 0 || was != 0 {
		return func() {}
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return func() {}
	}
	return func() { _, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 0, 0) }
}
