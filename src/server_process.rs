//! A stdio server's process and its process group, which is signalled only
//! while its number is provably still the server's.
//!
//! A stdio server is spawned as the leader of its own process group, so that
//! ending it reaches a whole `npx` → `node` tree. A group is addressed by its
//! leader's pid, and pids are handed out again once they wrap (at 32,768 by
//! default on Linux): once the leader has been reaped and the rest of its
//! group has gone, `kill(-pgid)` reaches whatever process group has that
//! number next, another program's. So the leader is never reaped while its
//! group may still be signalled. Its exit is observed without reaping it
//! (`waitid` with `WNOWAIT`), its zombie keeps the number taken, and it is
//! reaped only when the [`ServerProcess`] is dropped, right after a last
//! SIGKILL to the group. A group number is held by the kernel while any
//! member lives, so grandchildren that outlive the leader are still reached.
//!
//! Layer: sources (beside the transports). Imports nothing of ours.

// kill(2) on a process group and waitid(2) without reaping are system calls
// std does not offer.
#![allow(unsafe_code)]

use std::process::ExitStatus;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// A spawned stdio server, leader of its own process group (spawn it with
/// `process_group(0)`).
pub(crate) struct ServerProcess {
    pid: i32,
    /// Held, never waited for, until drop: it is what keeps `pid` ours.
    child: Mutex<Option<tokio::process::Child>>,
    exit: OnceLock<ExitStatus>,
}

impl ServerProcess {
    /// Takes over `child` (its pipes already taken or not). `None` if it has
    /// no pid, i.e. it was already waited for.
    pub(crate) fn new(child: tokio::process::Child) -> Option<ServerProcess> {
        let pid = i32::try_from(child.id()?).ok().filter(|p| *p > 1)?;
        Some(ServerProcess { pid, child: Mutex::new(Some(child)), exit: OnceLock::new() })
    }

    /// How the leader ended, if it has; it stays unreaped.
    pub(crate) fn exit_status(&self) -> Option<ExitStatus> {
        if let Some(s) = self.exit.get() {
            return Some(*s);
        }
        let status = peek_exit(self.pid)?;
        Some(*self.exit.get_or_init(|| status))
    }

    /// Waits (by polling, a few ms apart) up to `within` for the leader to
    /// end; `None` for "forever".
    pub(crate) async fn wait_exit(&self, within: Option<Duration>) -> Option<ExitStatus> {
        let deadline = within.map(|d| tokio::time::Instant::now() + d);
        let mut pause = Duration::from_millis(1);
        loop {
            if let Some(s) = self.exit_status() {
                return Some(s);
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return None;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Sends `signal` to the whole group. Sound at any time before drop: the
    /// unreaped leader keeps the number ours.
    pub(crate) fn signal_group(&self, signal: i32) {
        // SAFETY: kill(2) has no memory-safety preconditions; -pid addresses
        // the group this process leads, whose number its zombie still holds.
        unsafe {
            libc::kill(-self.pid, signal);
        }
    }

    /// Whether any member of the group other than a zombie is left (the
    /// leader or what it started). Linux reads `/proc`; elsewhere only the
    /// leader is known.
    pub(crate) fn group_running(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            group_has_running_member(self.pid)
        }
        #[cfg(not(target_os = "linux"))]
        {
            self.exit_status().is_none()
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // The last signal the group can get from us, then the leader is
        // released to be reaped (tokio reaps a dropped child in the
        // background), and only from then may its number be reused.
        self.signal_group(libc::SIGKILL);
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            let _ = child.try_wait();
        }
    }
}

/// The exit status of our child `pid` if it has ended, leaving it a zombie.
fn peek_exit(pid: i32) -> Option<ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    // SAFETY: an all-zero siginfo_t is valid; waitid writes into it and with
    // WNOHANG leaves si_pid 0 when nothing has changed.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: `info` is a valid, exclusively borrowed siginfo_t.
    if unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) } != 0 {
        return None;
    }
    // SAFETY: waitid filled `info` for a child state change (SIGCHLD).
    let (who, status) = unsafe { (info.si_pid(), info.si_status()) };
    if who == 0 {
        return None;
    }
    // Back to the wait(2) encoding ExitStatus is built from.
    let raw = match info.si_code {
        libc::CLD_EXITED => (status & 0xff) << 8,
        libc::CLD_KILLED => status & 0x7f,
        libc::CLD_DUMPED => (status & 0x7f) | 0x80,
        _ => return None, // stopped or continued, not ended
    };
    Some(ExitStatus::from_raw(raw))
}

/// Whether a process in group `pgid` is running (not a zombie), from
/// `/proc/<pid>/stat`: the state and the group are the 1st and 3rd fields
/// after the command name's closing parenthesis.
#[cfg(target_os = "linux")]
fn group_has_running_member(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.flatten().any(|e| {
        let name = e.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { return false };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
        let mut after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("").split_whitespace();
        let state = after.next();
        let group = after.nth(1).and_then(|g| g.parse::<i32>().ok());
        group == Some(pgid) && !matches!(state, Some("Z" | "X" | "x"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn(script: &str) -> ServerProcess {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(script).process_group(0);
        ServerProcess::new(cmd.spawn().expect("sh")).expect("a pid")
    }

    #[tokio::test]
    async fn the_exit_status_is_seen_and_the_leader_stays_unreaped() {
        let p = spawn("exit 7");
        let status = p.wait_exit(Some(Duration::from_secs(10))).await.expect("ended");
        assert_eq!(status.code(), Some(7));
        // Still a zombie: the number is ours, and the group answers signal 0.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid)).unwrap();
        assert!(stat.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'), "{stat}");
        assert!(!p.group_running());
        let pid = p.pid;
        drop(p);
        // Released: reaped in the background.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "zombie {pid} never reaped");
    }

    #[tokio::test]
    async fn a_signal_reaches_a_grandchild_after_the_leader_ended() {
        use std::os::unix::process::ExitStatusExt;
        let p = spawn("sleep 1000 & exit 0");
        assert_eq!(p.wait_exit(Some(Duration::from_secs(10))).await.and_then(|s| s.code()), Some(0));
        assert!(p.group_running(), "the grandchild runs on");
        p.signal_group(libc::SIGTERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while p.group_running() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!p.group_running());
        let killed = spawn("kill -9 $$");
        let status = killed.wait_exit(Some(Duration::from_secs(10))).await.expect("ended");
        assert_eq!(status.signal(), Some(9));
    }
}
