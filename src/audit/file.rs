//! The JSONL sink: one record per line, appended by a thread of its own
//! (file writes block), rotated by size: past `max_bytes` the file becomes
//! `PATH.1`, an older `PATH.1` becomes `PATH.2`, and so on up to `PATH.keep`;
//! older ones are removed. A file it makes is mode 0600 (owner only), as
//! the token file is; rotation renames, so the older files keep it. Read
//! back here too, rotated files included, for `mcp-context audit`.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::{Msg, Stats};

/// Starts the writer thread. It ends when every sender is gone, after writing what was queued.
pub(super) fn spawn(path: PathBuf, max_bytes: u64, keep: usize, rx: mpsc::Receiver<Msg>, stats: Arc<Stats>) {
    let spawned = std::thread::Builder::new().name("mcp-context-audit-file".into()).spawn({
        let stats = stats.clone();
        move || Writer { path, max_bytes, keep, out: None, size: 0, stats }.run(rx)
    });
    if let Err(e) = spawned {
        stats.down(format!("cannot start the file writer: {e}"));
    }
}

struct Writer {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    out: Option<BufWriter<File>>,
    size: u64,
    stats: Arc<Stats>,
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        if let Err(e) = self.open() {
            self.stats.down(self.describe(&e));
        }
        while let Some(msg) = rx.blocking_recv() {
            self.handle(msg);
            // Drain what is already queued before flushing: one flush per burst.
            while let Ok(msg) = rx.try_recv() {
                self.handle(msg);
            }
            self.flush();
        }
        self.flush();
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Record(r) => {
                let mut line = serde_json::to_vec(&*r).unwrap_or_default();
                line.push(b'\n');
                match self.write(&line) {
                    Ok(()) => {
                        self.stats.written(1);
                        self.stats.up();
                    }
                    Err(e) => {
                        self.stats.dropped(1);
                        self.stats.down(self.describe(&e));
                        // Opened again for the next record.
                        self.out = None;
                    }
                }
            }
            Msg::Flush(done) => {
                self.flush();
                let _ = done.send(());
            }
        }
    }

    fn describe(&self, e: &std::io::Error) -> String {
        format!("{}: {e}", self.path.display())
    }

    fn open(&mut self) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        // Made owner-only, like the token file: a record says who received what. A file that already
        // exists keeps the mode it has (an operator may have opened it to a log shipper's group).
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let f = options.open(&self.path)?;
        self.size = f.metadata()?.len();
        self.out = Some(BufWriter::new(f));
        self.stats.up();
        Ok(())
    }

    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.out.is_none() {
            self.open()?;
        }
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        let out = self.out.as_mut().expect("opened above");
        out.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn flush(&mut self) {
        if let Some(out) = self.out.as_mut()
            && let Err(e) = out.flush()
        {
            self.stats.down(format!("{}: {e}", self.path.display()));
            self.out = None;
        }
    }

    /// `PATH` → `PATH.1` → … → `PATH.keep`; the oldest beyond `keep` is removed.
    fn rotate(&mut self) -> std::io::Result<()> {
        if let Some(mut out) = self.out.take() {
            out.flush()?;
        }
        let numbered = |n: usize| rotated(&self.path, n);
        if self.keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            let _ = std::fs::remove_file(numbered(self.keep));
            for n in (1..self.keep).rev() {
                let from = numbered(n);
                if from.exists() {
                    std::fs::rename(&from, numbered(n + 1))?;
                }
            }
            std::fs::rename(&self.path, numbered(1))?;
        }
        self.open()
    }
}

/// The records of the file sink at `path` and its rotated files (oldest
/// first: `PATH.keep` … `PATH.1`, then `PATH`) that answer `q`, oldest
/// first. A last line without its newline is one being written, skipped;
/// any other line that is not a record is an error naming its file and line.
pub(super) fn query(path: &Path, keep: usize, q: &super::AuditQuery) -> crate::Result<Vec<super::AuditRecord>> {
    let (since, wanted) = match q {
        super::AuditQuery::WhoReceived { resource, since } => (since, Wanted::Resource(resource)),
        super::AuditQuery::ReceivedBy { user, since } => (since, Wanted::User(user)),
    };
    let files: Vec<PathBuf> = (1..=keep).rev().map(|n| rotated(path, n)).chain([path.to_owned()]).collect();
    let mut out = Vec::new();
    let mut found = false;
    for file in &files {
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(crate::Error::audit(format!("cannot read the audit file {}: {e}", file.display()))),
        };
        found = true;
        let complete = text.ends_with('\n');
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() || (!complete && i + 1 == lines.len()) {
                continue;
            }
            let r: super::AuditRecord = serde_json::from_str(line)
                .map_err(|e| crate::Error::audit(format!("{}:{}: not an audit record: {e}", file.display(), i + 1)))?;
            if since.as_deref().is_none_or(|t| r.at.as_str() >= t) && wanted.answers(&r) {
                out.push(r);
            }
        }
    }
    if !found {
        return Err(crate::Error::audit(format!(
            "the audit file {} does not exist (yet): nothing has been recorded there",
            path.display()
        )));
    }
    out.sort_by(|a, b| a.at.cmp(&b.at));
    Ok(out)
}

/// The records a query is about.
enum Wanted<'a> {
    /// Those that carried this `server:uri`.
    Resource(&'a str),
    /// Those made for this user.
    User(&'a str),
}

impl Wanted<'_> {
    fn answers(&self, r: &super::AuditRecord) -> bool {
        match self {
            Wanted::Resource(id) => r.included.iter().any(|i| i.id == *id),
            Wanted::User(user) => r.user == *user,
        }
    }
}

/// `PATH.n`.
fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::record::{AuditRecord, Origin};

    #[tokio::test]
    async fn files_rotate_by_size_and_keep_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/audit.jsonl");
        let (tx, rx) = mpsc::channel(100);
        let stats = Arc::new(Stats::default());
        spawn(path.clone(), 600, 2, rx, stats.clone());
        let report = crate::report::Report { user: "alice".into(), ..Default::default() };
        for _ in 0..20 {
            let r =
                AuditRecord::new(&report, crate::audit::included(&report, None), &[], Origin::library(&report), true);
            tx.send(Msg::Record(Arc::new(r))).await.unwrap();
        }
        let (done, wait) = tokio::sync::oneshot::channel();
        tx.send(Msg::Flush(done)).await.unwrap();
        wait.await.unwrap();
        assert_eq!(stats.written.load(std::sync::atomic::Ordering::Relaxed), 20);
        for p in [path.clone(), rotated(&path, 1), rotated(&path, 2)] {
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(text.len() <= 600 && !text.is_empty(), "{}: {}", p.display(), text.len());
            for line in text.lines() {
                let r: AuditRecord = serde_json::from_str(line).unwrap();
                assert_eq!(r.user, "alice");
            }
        }
        assert!(!rotated(&path, 3).exists());
    }
}
