//go:build unix && !linux

package pgtest

import (
	"errors"
	"syscall"
)

// serverProcAttr runs a server binary as cred (nil: as this process) in its own process group,
// so that a terminal's Ctrl-C reaches only this process, which then stops the server.
func serverProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}

// childrenOf is not implemented here: children of a killed postmaster exit on their own.
func childrenOf(int) []int { return nil }

// orphans is not implemented here.
func orphans() []int { return nil }

// isChild is not implemented here.
func isChild(int) bool { return false }

// gone reports whether pid has exited.
func gone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

// becomeSubreaper is not available here.
func becomeSubreaper() (restore func()) { return func() {} }
