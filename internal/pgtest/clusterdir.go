//go:build unix

package pgtest

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// binaries are the server programs a local cluster needs.
type binaries struct {
	initdb   string
	postgres string
}

// findBinaries finds initdb and postgres on PATH, else in binaryDirs.
func findBinaries() (binaries, error) {
	initdb, err1 := exec.LookPath("initdb")
	postgres, err2 := exec.LookPath("postgres")
	if err1 == nil && err2 == nil {
		return binaries{initdb: initdb, postgres: postgres}, nil
	}
	var dirs []string
	for _, pattern := range binaryDirs {
		matches, _ := filepath.Glob(pattern)
		dirs = append(dirs, matches...)
	}
	slices.SortStableFunc(dirs, func(a, b string) int { return -compareVersions(dirVersion(a), dirVersion(b)) })
	for _, dir := range dirs {
		b := binaries{initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
		if isExecutable(b.initdb) && isExecutable(b.postgres) {
			return b, nil
		}
	}
	return binaries{}, unavailable("no initdb and postgres on PATH or under " + strings.Join(binaryDirs, ", "))
}

// dirVersion returns the version in a binary directory's name: 15 in /usr/lib/postgresql/15/bin,
// 9.6 in /usr/pgsql-9.6/bin.
func dirVersion(dir string) []int {
	name := filepath.Base(filepath.Dir(dir))
	name = strings.TrimPrefix(name, "pgsql-")
	var v []int
	for _, part := range strings.Split(name, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			break
		}
		v = append(v, n)
	}
	return v
}

func compareVersions(a, b []int) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if c := cmp.Compare(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// serverUser returns the credentials to run the server with: the OS user postgres when this
// process runs as root (initdb and postgres refuse to run as root), else nil.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, unavailable("running as root, the server must run as the OS user postgres " +
			"(initdb and postgres refuse to run as root), which was not found: " + err.Error())
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgtest: user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// baseDir returns the directory to create the cluster directory in: os.TempDir(), or /tmp when
// that path is too long for a unix socket or the server user cannot reach it.
func baseDir(cred *syscall.Credential) (string, error) {
	for _, dir := range []string{os.TempDir(), "/tmp"} {
		// The socket path (dir/pgtest-NNN/sock/.s.PGSQL.NNNNN) must fit in about 100 bytes.
		if len(dir) > 60 {
			continue
		}
		if cred == nil || reachable(dir, cred) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgtest: no temporary directory the user postgres can reach (TMPDIR=%q)", os.Getenv("TMPDIR"))
}

// reachable reports whether the user of cred may traverse dir and all its parents.
func reachable(dir string, cred *syscall.Credential) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		st, err := os.Stat(dir)
		if err != nil || !st.IsDir() {
			return false
		}
		perm := st.Mode().Perm()
		sys, ok := st.Sys().(*syscall.Stat_t)
		switch {
		case perm&0o001 != 0:
		case ok && sys.Uid == cred.Uid && perm&0o100 != 0:
		case ok && sys.Gid == cred.Gid && perm&0o010 != 0:
		default:
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// ownerFile holds the pid of the process that created a cluster directory.
const ownerFile = "owner.pid"

// makeClusterDir creates the cluster's temporary directory and its socket directory, owned by
// the server user.
func makeClusterDir(base string, cred *syscall.Credential) (dir string, err error) {
	dir, err = os.MkdirTemp(base, "pgtest-")
	if err != nil {
		return "", fmt.Errorf("pgtest: create directory: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return "", fmt.Errorf("pgtest: create directory: %w", err)
	}
	sock := filepath.Join(dir, "sock")
	if err := os.Mkdir(sock, 0o700); err != nil {
		return "", fmt.Errorf("pgtest: create directory: %w", err)
	}
	if cred != nil {
		for _, d := range []string{dir, sock} {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				return "", fmt.Errorf("pgtest: hand the directory to user postgres: %w", err)
			}
		}
	}
	return dir, nil
}

// sweepStale removes cluster directories left by processes that died without stopping their
// server (a panic or a test timeout ends the process before deferred cleanup runs).
func sweepStale(base string, logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(base, "pgtest-*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		owner, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || alive(owner) {
			continue
		}
		if pid, err := readPostmasterPid(filepath.Join(dir, "data")); err == nil && alive(pid) {
			continue
		}
		if err := os.RemoveAll(dir); err == nil {
			logf("pgtest: removed %s, left by process %d", dir, owner)
		}
	}
}

// alive reports whether a process with this pid exists (zombies included).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// serverEnv is the environment of initdb and postgres: this process's, without libpq and
// locale variables, in the C locale so that messages are in English.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "LANG=C")
}
