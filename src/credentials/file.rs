//! The `file` credential store: one JSON file of sealed records, keyed by
//! server and by the SHA-256 of the user name (user names, whatever
//! characters they hold, never become paths or keys of their own), written
//! atomically (a temporary file in the same folder, mode 0600, then
//! renamed over the old one).
//!
//! ```json
//! {"version":1,"records":{"jira":{"<sha256(user) hex>":"<base64 of the sealed record>"}}}
//! ```
//!
//! The file is read again on every lookup, so a secret stored by
//! `mcp-context auth set` is seen by a running `serve` at once. A change
//! (read, change, rename) holds an exclusive lock on `.<name>.lock` beside
//! the file (`flock` on Unix, `LockFileEx` on Windows), so writers in any
//! number of processes on one machine lose no change; readers take no lock
//! (the rename shows them the old file or the new, whole). A network file
//! system that does not honour these locks is not supported for writers in
//! several processes.
//!
//! Layer: sources (credentials). Imports the sealing and the error type.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::seal::{Sealer, store_error};
use super::{TokenSet, TokenStore, user_key};
use crate::error::{Error, Result};

/// Sealed records in a local file.
#[derive(Debug)]
pub struct FileTokenStore {
    path: PathBuf,
    sealer: Sealer,
    write: tokio::sync::Mutex<()>,
}

#[derive(Serialize, Deserialize, Default)]
struct Doc {
    version: u32,
    #[serde(default)]
    records: BTreeMap<String, BTreeMap<String, String>>,
}

impl FileTokenStore {
    /// A store in `path`, sealing with `sealer` (the file is made on the
    /// first write).
    pub fn new(path: impl Into<PathBuf>, sealer: Sealer) -> Self {
        FileTokenStore { path: path.into(), sealer, write: tokio::sync::Mutex::new(()) }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn load(&self) -> Result<Doc> {
        match tokio::fs::read(&self.path).await {
            Ok(bytes) => parse(&self.path, &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Doc { version: 1, ..Doc::default() }),
            Err(e) => Err(store_error(&format!("cannot read `{}`", self.path.display()), e)),
        }
    }

    /// Applies `change` to the file under its lock: no other writer, in
    /// this process or another, reads or renames between our read and our
    /// rename.
    async fn update(&self, change: impl FnOnce(&mut Doc) + Send + 'static) -> Result<()> {
        let _one = self.write.lock().await;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let _lock = lock(&path)?;
            let mut doc = match std::fs::read(&path) {
                Ok(bytes) => parse(&path, &bytes)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Doc::default(),
                Err(e) => return Err(store_error(&format!("cannot read `{}`", path.display()), e)),
            };
            doc.version = 1;
            change(&mut doc);
            let bytes =
                serde_json::to_vec_pretty(&doc).map_err(|e| store_error("cannot encode the credential file", e))?;
            write_atomically(&path, &bytes)
        })
        .await
        .map_err(Error::task("credential file write"))?
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Doc> {
    serde_json::from_slice(bytes)
        .map_err(|e| store_error(&format!("`{}` is not a credential file of this version", path.display()), e))
}

/// The folder of `path`, made (mode 0700) if missing.
fn folder(path: &Path) -> Result<&Path> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| store_error(&format!("cannot make the folder of `{}`", path.display()), e))?;
    Ok(dir)
}

/// An exclusive lock on `.<name>.lock` beside `path` (made, mode 0600, and
/// never removed: removing it would let two writers lock two files), held
/// until the returned file is dropped.
fn lock(path: &Path) -> Result<std::fs::File> {
    let name = format!(".{}.lock", path.file_name().and_then(|n| n.to_str()).unwrap_or("tokens"));
    let lock_path = folder(path)?.join(name);
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file =
        options.open(&lock_path).map_err(|e| store_error(&format!("cannot open `{}`", lock_path.display()), e))?;
    file.lock().map_err(|e| store_error(&format!("cannot lock `{}`", lock_path.display()), e))?;
    Ok(file)
}

/// `bytes` into `path` by a temporary file in the same folder (mode 0600,
/// synced) renamed over it: a reader sees the old file or the new, whole.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let io = |what: &str, e: std::io::Error| store_error(&format!("{what} `{}`", path.display()), e);
    let dir = folder(path)?;
    let mut random = [0u8; 8];
    let _ = getrandom::fill(&mut random);
    let name = format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("tokens"), hex(&random));
    let tmp = dir.join(name);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let result = (|| {
        let mut f = options.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| io("cannot write", e))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl TokenStore for FileTokenStore {
    fn get<'a>(&'a self, server: &'a str, user: &'a str) -> BoxFuture<'a, Result<Option<TokenSet>>> {
        Box::pin(async move {
            let doc = self.load().await?;
            let Some(record) = doc.records.get(server).and_then(|m| m.get(&user_key(user))) else { return Ok(None) };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(record)
                .map_err(|e| store_error(&format!("a record of server `{server}` is not base64"), e))?;
            self.sealer.open(server, user, &bytes).map(Some)
        })
    }

    fn put<'a>(&'a self, server: &'a str, user: &'a str, tokens: &'a TokenSet) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let sealed = base64::engine::general_purpose::STANDARD.encode(self.sealer.seal(server, user, tokens)?);
            let (server, user) = (server.to_owned(), user_key(user));
            self.update(move |doc| {
                doc.records.entry(server).or_default().insert(user, sealed);
            })
            .await
        })
    }

    fn delete<'a>(&'a self, server: &'a str, user: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let (server, user) = (server.to_owned(), user_key(user));
            self.update(move |doc| {
                if let Some(m) = doc.records.get_mut(&server) {
                    m.remove(&user);
                    if m.is_empty() {
                        doc.records.remove(&server);
                    }
                }
            })
            .await
        })
    }

    fn count<'a>(&'a self, server: &'a str) -> BoxFuture<'a, Result<Option<usize>>> {
        Box::pin(async move { Ok(Some(self.load().await?.records.get(server).map_or(0, BTreeMap::len))) })
    }
}

#[cfg(test)]
mod tests {
    use secrecy::{ExposeSecret, SecretString};

    use super::*;
    use crate::config::SecretKey;

    fn sealer(b: u8) -> Sealer {
        Sealer::new(&SecretKey::parse(&format!("{b:02x}").repeat(32)).unwrap())
    }

    fn headers(v: &str) -> TokenSet {
        let mut t = TokenSet::bearer(SecretString::from(String::new()), "");
        t.headers = vec![("X-Api-Key".into(), SecretString::from(v.to_owned()))];
        t
    }

    #[tokio::test]
    async fn round_trip_mode_0600_nothing_in_clear_and_odd_user_names_stay_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/tokens.json");
        let store = FileTokenStore::new(&path, sealer(1));
        assert!(store.get("jira", "alice").await.unwrap().is_none());
        store.put("jira", "alice", &headers("alice-SECRET-1")).await.unwrap();
        let users = ["bob", "Alice", "alice ", "../alice", "alice/..", "jira:alice", "a/b", ":", ""];
        for u in users {
            store.put("jira", u, &headers(&format!("{u}-SECRET-x"))).await.unwrap();
        }
        let got = store.get("jira", "alice").await.unwrap().unwrap();
        assert_eq!(got.headers[0].1.expose_secret(), "alice-SECRET-1");
        for u in users {
            let got = store.get("jira", u).await.unwrap().unwrap();
            assert_eq!(got.headers[0].1.expose_secret(), format!("{u}-SECRET-x"));
        }
        assert!(store.get("drive", "alice").await.unwrap().is_none());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("SECRET") && !text.contains("alice") && !text.contains("X-Api-Key"), "{text}");
        // Only the file and its lock: no temporary left, nothing named after a user.
        let mut names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".tokens.json.lock", "tokens.json"]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert_eq!(store.count("jira").await.unwrap(), Some(users.len() + 1));
        store.delete("jira", "alice").await.unwrap();
        assert!(store.get("jira", "alice").await.unwrap().is_none());
        assert!(store.get("jira", "bob").await.unwrap().is_some());
    }

    /// Two stores on one file, as two processes (`serve` and `auth set`)
    /// are: their writers are not serialised by each other's mutex, so only
    /// the file lock keeps every change.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_writers_on_one_file_lose_no_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        let stores = [
            std::sync::Arc::new(FileTokenStore::new(&path, sealer(1))),
            std::sync::Arc::new(FileTokenStore::new(&path, sealer(1))),
        ];
        let tasks: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(w, store)| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in 0..60 {
                        store.put("jira", &format!("user-{w}-{i}"), &headers("v")).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(stores[0].count("jira").await.unwrap(), Some(120));
        // The lock file stays beside it (empty, mode 0600); no temporary is left.
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".tokens.json.lock", "tokens.json"]);
    }

    #[tokio::test]
    async fn wrong_key_and_swapped_records_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        FileTokenStore::new(&path, sealer(1)).put("jira", "alice", &headers("alice-SECRET-1")).await.unwrap();
        FileTokenStore::new(&path, sealer(1)).put("jira", "bob", &headers("bob-SECRET-2")).await.unwrap();
        let e = FileTokenStore::new(&path, sealer(2)).get("jira", "alice").await.unwrap_err().to_string();
        assert!(e.contains("another key"), "{e}");
        // Bob's record copied over alice's slot (an attacker with write access to the file) does not open.
        let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let (a, b) = (user_key("alice"), user_key("bob"));
        let bob = doc["records"]["jira"][&b].clone();
        doc["records"]["jira"][&a] = bob;
        std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
        let store = FileTokenStore::new(&path, sealer(1));
        assert!(store.get("jira", "alice").await.is_err());
        assert!(store.get("jira", "bob").await.unwrap().is_some());
    }
}
