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
//! `mcp-context auth set` is seen by a running `serve` at once. Writers in
//! one process are serialised; two processes writing at the same moment may
//! lose one of the two changes (the last rename wins), never corrupt the file.
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
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                store_error(&format!("`{}` is not a credential file of this version", self.path.display()), e)
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Doc { version: 1, ..Doc::default() }),
            Err(e) => Err(store_error(&format!("cannot read `{}`", self.path.display()), e)),
        }
    }

    async fn save(&self, doc: &Doc) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(doc).map_err(|e| store_error("cannot encode the credential file", e))?;
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .map_err(Error::task("credential file write"))?
    }

    async fn update(&self, change: impl FnOnce(&mut Doc)) -> Result<()> {
        let _one = self.write.lock().await;
        let mut doc = self.load().await?;
        doc.version = 1;
        change(&mut doc);
        self.save(&doc).await
    }
}

/// `bytes` into `path` by a temporary file in the same folder (mode 0600,
/// synced) renamed over it: a reader sees the old file or the new, whole.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let io = |what: &str, e: std::io::Error| store_error(&format!("{what} `{}`", path.display()), e);
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir).map_err(|e| io("cannot make the folder of", e))?;
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
            self.update(|doc| {
                doc.records.entry(server.to_owned()).or_default().insert(user_key(user), sealed);
            })
            .await
        })
    }

    fn delete<'a>(&'a self, server: &'a str, user: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.update(|doc| {
                if let Some(m) = doc.records.get_mut(server) {
                    m.remove(&user_key(user));
                    if m.is_empty() {
                        doc.records.remove(server);
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
        // Only the one file: no temporary left, nothing named after a user.
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
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
