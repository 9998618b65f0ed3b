// Package lock is a client's advisory lock: its key, derived from the token table and client
// name ([Key]); the statements a session held out of the pool takes and releases it with
// ([TryLock], [Release]); the watcher's lock sessions ([Session]); and the exclusive lock's
// service ([Elector]), with which watchers of Config.Exclusive elect one to deliver while the
// others wait as standbys. The watcher's sessions and the admin package's calls that refuse
// while a watcher runs (ErrClientActive) lock through it, so that they exclude each other.
//
// # Failure model
//
// The lock is a session advisory lock: it is held exactly as long as the server keeps its
// session, and nothing else. A standby tries it every [StandbyPoll] (jittered), and after a
// failed try (no session, or no answer) with a capped, jittered backoff. The active watcher
// pings its session every half second; a failed check means the lock may be someone else's
// now, so the watcher stops delivering and refuses later saves (ErrExclusiveLost). It does not
// take the lock again: its successor resumes from the saved token.
//
// A watcher that takes the lock waits [SettleTime], pinging its session, and then checks that
// its session still holds the lock, before it loads the token and delivers: longer than the
// previous owner needs to find its session gone, so that, without pauses, two watchers never
// deliver at the same time. A session lost during the wait sends it back to waiting.
//
// Lost session: the server ended it (terminated, restarted, crashed) or the connection broke.
// The next check fails and the watcher stops; the lock is free at once, and a standby takes it
// within a poll and the settle wait.
//
// Network cut or vanished host: the server cannot tell a silent peer from a slow one, so the
// lock outlives the host until the server ends the session. Each session sets TCP keepalives
// and tcp_user_timeout on both ends, so that the server ends it within SessionTimeout (a
// server that refuses the settings is warned about once, and then relies on its own TCP
// timeouts). The watcher on the far side of the cut finds its session dead on its next checks
// and stops.
//
// Paused process: timing cannot bound a process that is stopped (by a debugger, a VM pause, a
// long GC) between a check and a save: its session may have ended, and a successor may be
// delivering. The lock is therefore backed by fencing: while it holds the lock, the active
// watcher claims an owner epoch in the token row on its lock session, in a statement that
// checks that the session holds the lock ([HeldBySessionSQL]), so that claims are ordered as
// lock ownership is; every save carries the claimed epoch, and a save after a successor's
// claim changes nothing and stops the watcher (ErrFenced). The successor's claim reads the
// token in the same statement, so it resumes from the last save that landed.
package lock
