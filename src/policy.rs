//! Access policy: which resources a user may see, their token budget, and
//! which resources to read for them even when no listing shows them.
//!
//! A policy is one YAML file or a folder of them (merged). It is loaded
//! strictly and fails closed: any doubt about what a file means is a load
//! error naming the file and line, never a silently wider or narrower policy.
//! Everything is compiled once at load; [`Policy::for_user`] only clones
//! `Arc`s, and [`UserPolicy::decide`] runs precompiled globs, because it is
//! called for every resource on every request.
//!
//! # Globs
//!
//! Rule fields (`server`, `uri`, `mime`) are globs matched case-sensitively
//! against the whole string:
//!
//! * `*` matches any run of characters except `/`;
//! * `**` (or any longer run of stars) matches any run of characters
//!   including `/`, wherever it appears: `x**` matches `x/a/b`, and
//!   `a/**/b` matches `a/x/y/b` and `a//b` but, unlike gitignore, not `a/b`;
//! * `?` matches one character other than `/`, `[ab]` / `[!ab]` one character
//!   (never `/`) of / not of a class; both are byte-wise, so they match one
//!   ASCII character (URIs are ASCII: RFC 3986 percent-encodes the rest);
//! * `\x` matches `x` literally; `{a,b}` is an alternation (a globset
//!   extension): write `\{` for a literal brace.
//!
//! Matching uses `globset` with `literal_separator(true)`. globset gives `**`
//! gitignore semantics (`**/a` matches `a`, `a/**/b` matches `a/b`, `x**`
//! acts like `x*`), so each run of stars is rewritten before compiling: the
//! run matches either a run without `/` (`*`) or one with at least one `/`
//! (`*/**/*`, which globset compiles to `[^/]*(/|/.*/)[^/]*`). A pattern with
//! `k` runs thus becomes `2^k` globs, of which any may match; `k` is capped at
//! [`MAX_RECURSIVE_RUNS`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use globset::{GlobBuilder, GlobMatcher};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, quote};
use crate::gate::{canonical_glob, canonical_uri};
use crate::id::ResourceId;
use crate::resource::Resource;

/// Most `**` runs one pattern may hold: each doubles the number of globs
/// compiled and tried, and real policies need one or two.
pub const MAX_RECURSIVE_RUNS: usize = 4;

/// The placeholder in `include` entries replaced by the (encoded) user name.
const USER_PLACEHOLDER: &str = "{user}";

/// Everything but RFC 3986 unreserved characters is percent-encoded in user
/// names, so a name can never add `/`, `?`, `#` or `:` structure to a URI.
/// (The names `.` and `..` would still be dot-segments: see `for_user`.)
const USER_ENCODE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

/// A loaded, compiled policy. `Send + Sync`; share it with `Arc`.
#[derive(Debug)]
pub struct Policy {
    files: Vec<PathBuf>,
    default_roles: Vec<String>,
    roles: BTreeMap<String, Arc<Grant>>,
    users: BTreeMap<String, UserEntry>,
}

/// What one user may see: the compiled rules of the user and their roles.
/// Cheap to build and clone (the rules are shared).
#[derive(Clone, Debug)]
pub struct UserPolicy {
    user: String,
    roles: Vec<String>,
    known: bool,
    /// The user's own grant first, then each role's, in role order.
    grants: Vec<Arc<Grant>>,
    max_tokens: Option<usize>,
    includes: Vec<ResourceId>,
}

/// The outcome of [`UserPolicy::decide`] for one resource, with the rule that
/// settled it so reports can say *why*.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Whether the user may see the resource.
    pub allowed: bool,
    /// When denied by a rule: the first matching deny rule. When allowed: the
    /// first matching allow rule. `None` when no rule matched (denied).
    pub rule: Option<RuleRef>,
}

/// Whether a rule grants or withholds access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// An `allow` rule.
    Allow,
    /// A `deny` rule; deny always wins over allow.
    Deny,
}

/// Where a rule came from, for explanations: `file:line: role staff deny[0] {…}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleRef {
    /// The policy file holding the rule.
    pub file: PathBuf,
    /// 1-based line of the rule (best effort; `None` if it could not be found).
    pub line: Option<usize>,
    /// `role NAME` or `user NAME`.
    pub owner: String,
    /// Allow or deny.
    pub effect: Effect,
    /// Position in the owner's `allow` or `deny` list, from 0.
    pub index: usize,
    /// The rule as written, e.g. `{ server: "*", uri: "secret://**" }`.
    pub rule: String,
}

/// An overview of a policy, for `mcp-context policy check`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicySummary {
    /// The files loaded, in merge order.
    pub files: Vec<PathBuf>,
    /// Roles of users not listed under `users` (empty: they see nothing).
    pub default_roles: Vec<String>,
    /// The roles, by name.
    pub roles: Vec<RoleSummary>,
    /// The listed users, by name.
    pub users: Vec<UserSummary>,
}

/// One role in a [`PolicySummary`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoleSummary {
    /// Role name.
    pub name: String,
    /// Number of allow rules.
    pub allow: usize,
    /// Number of deny rules.
    pub deny: usize,
    /// The role's token budget, if set.
    pub max_tokens: Option<usize>,
    /// Number of `include` entries.
    pub include: usize,
}

/// One user in a [`PolicySummary`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UserSummary {
    /// User name.
    pub name: String,
    /// The user's roles.
    pub roles: Vec<String>,
}

impl Policy {
    /// Loads a file, or a folder of `*.yaml`/`*.yml` files (non-recursive,
    /// merged in name order; names starting with `.` are skipped, as a shell
    /// glob would).
    pub fn load(path: &Path) -> Result<Policy> {
        let meta = std::fs::metadata(path)
            .map_err(|e| policy_error(path, None, format!("cannot read policy file or folder: {e}")))?;
        let paths = if meta.is_dir() {
            let entries = std::fs::read_dir(path)
                .map_err(|e| policy_error(path, None, format!("cannot read policy folder: {e}")))?;
            let mut paths = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|e| policy_error(path, None, format!("cannot read policy folder: {e}")))?;
                let p = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
                if yaml && !name.starts_with('.') && p.is_file() {
                    paths.push(p);
                }
            }
            if paths.is_empty() {
                return Err(policy_error(
                    path,
                    None,
                    "no policy files (*.yaml, *.yml) in this folder; add one or point `policy` at a file".into(),
                ));
            }
            paths.sort();
            paths
        } else {
            vec![path.to_path_buf()]
        };
        let mut files = Vec::with_capacity(paths.len());
        for p in paths {
            let text = std::fs::read_to_string(&p)
                .map_err(|e| policy_error(&p, None, format!("cannot read policy file: {e}")))?;
            files.push((p, text));
        }
        build(&files)
    }

    /// Parses one file's text (`path` is only used in errors and rule references).
    pub fn from_yaml(src: &str, path: &Path) -> Result<Policy> {
        build(&[(path.to_path_buf(), src.to_owned())])
    }

    /// A policy under which every user sees every resource (used when the
    /// config names no policy). Every user gets the role `all`.
    pub fn allow_all() -> Policy {
        let file = PathBuf::from("(built-in allow-all policy)");
        let rule = Rule {
            server: Pattern::any(),
            uri: Pattern::any(),
            mime: None,
            reference: RuleRef {
                file: file.clone(),
                line: None,
                owner: "role all".into(),
                effect: Effect::Allow,
                index: 0,
                rule: r#"{ server: "*", uri: "**" }"#.into(),
            },
        };
        let grant = Grant { allow: vec![rule], ..Grant::default() };
        Policy {
            files: vec![file],
            default_roles: vec!["all".into()],
            roles: BTreeMap::from([("all".to_owned(), Arc::new(grant))]),
            users: BTreeMap::new(),
        }
    }

    /// The compiled view of one user: roles resolved, rules gathered,
    /// includes expanded. Users not listed get `default_roles`.
    pub fn for_user(&self, user: &str) -> UserPolicy {
        let entry = self.users.get(user);
        let roles = entry.map_or(&self.default_roles, |u| &u.roles).clone();
        let mut grants: Vec<Arc<Grant>> = entry.map(|u| Arc::clone(&u.own)).into_iter().collect();
        // Every role name was checked against `roles` at load, so none is dropped here.
        grants.extend(roles.iter().filter_map(|r| self.roles.get(r).cloned()));
        let max_tokens =
            entry.and_then(|u| u.own.max_tokens).or_else(|| grants.iter().filter_map(|g| g.max_tokens).max());
        let encoded = utf8_percent_encode(user, USER_ENCODE).to_string();
        // Validated at load with a placeholder; only an absurdly long user name
        // can fail here, and then that include is skipped (fail closed). So are
        // `{user}` includes for the names `.` and `..`, which a server could
        // resolve as "this/parent folder" (encoding them changes nothing: RFC
        // 3986 makes `%2E` and `.` equivalent).
        let dots = user == "." || user == "..";
        let expanded = grants.iter().flat_map(|g| &g.includes).filter_map(|inc| {
            if dots && inc.uri.contains(USER_PLACEHOLDER) {
                return None;
            }
            ResourceId::new(inc.server.clone(), inc.uri.replace(USER_PLACEHOLDER, &encoded)).ok()
        });
        let includes = dedup(expanded.collect());
        UserPolicy { user: user.to_owned(), roles, known: entry.is_some(), grants, max_tokens, includes }
    }

    /// Summary for `mcp-context policy check`.
    pub fn summary(&self) -> PolicySummary {
        PolicySummary {
            files: self.files.clone(),
            default_roles: self.default_roles.clone(),
            roles: self
                .roles
                .iter()
                .map(|(name, g)| RoleSummary {
                    name: name.clone(),
                    allow: g.allow.len(),
                    deny: g.deny.len(),
                    max_tokens: g.max_tokens,
                    include: g.includes.len(),
                })
                .collect(),
            users: self
                .users
                .iter()
                .map(|(name, u)| UserSummary { name: name.clone(), roles: u.roles.clone() })
                .collect(),
        }
    }
}

impl UserPolicy {
    /// The user name this view was built for.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The resolved roles (empty means "no access" unless the user has rules of
    /// their own).
    pub fn roles(&self) -> &[String] {
        &self.roles
    }

    /// True when the user is listed under `users` (false: `default_roles` apply).
    pub fn is_known(&self) -> bool {
        self.known
    }

    /// Decides whether the user may see `resource`: some allow rule matches and
    /// no deny rule does. A rule with `mime` only matches a resource whose
    /// *listing* gave a matching MIME type: we decide before reading, so a
    /// resource without a listed MIME type never matches such a rule (an
    /// allow-by-MIME does not let it in, a deny-by-MIME does not keep it out;
    /// use a `uri` rule where that matters).
    pub fn decide(&self, resource: &Resource) -> Decision {
        let first = |effect: Effect| self.grants.iter().flat_map(|g| g.rules(effect)).find(|r| r.matches(resource));
        if let Some(rule) = first(Effect::Deny) {
            return Decision { allowed: false, rule: Some(rule.reference.clone()) };
        }
        match first(Effect::Allow) {
            Some(rule) => Decision { allowed: true, rule: Some(rule.reference.clone()) },
            None => Decision { allowed: false, rule: None },
        }
    }

    /// The policy's token budget for this user: their own `max_tokens`, else
    /// the largest among their roles, else `None` (use the config's).
    pub fn max_tokens(&self) -> Option<usize> {
        self.max_tokens
    }

    /// Resources to read for this user even if no listing shows them: their
    /// own includes, then their roles', `{user}` expanded, without duplicates.
    pub fn includes(&self) -> &[ResourceId] {
        &self.includes
    }

    /// Like [`Decision::detail`], but says who was asked when no rule matched:
    /// `no allow rule matches (user bob, roles: public)`.
    pub fn explain(&self, decision: &Decision) -> String {
        if decision.rule.is_some() {
            return decision.detail();
        }
        let roles = if self.roles.is_empty() { "none".to_owned() } else { self.roles.join(", ") };
        let listed = if self.known { "" } else { " (not listed under users)" };
        format!("{} (user {}{listed}, roles: {roles})", decision.detail(), self.user)
    }
}

impl Decision {
    /// One line saying why: `denied by FILE:LINE: role staff deny[0] { … }`,
    /// `allowed by …`, or `no allow rule matches`.
    pub fn detail(&self) -> String {
        match (&self.rule, self.allowed) {
            (Some(rule), true) => format!("allowed by {rule}"),
            (Some(rule), false) => format!("denied by {rule}"),
            (None, true) => "allowed".into(),
            (None, false) => "no allow rule matches".into(),
        }
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Effect::Allow => "allow",
            Effect::Deny => "deny",
        })
    }
}

impl fmt::Display for RuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": {} {}[{}] {}", self.owner, self.effect, self.index, self.rule)
    }
}

impl fmt::Display for PolicySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
        writeln!(f, "policy files: {}", files.join(", "))?;
        if self.default_roles.is_empty() {
            writeln!(f, "default roles: none (users not listed see nothing)")?;
        } else {
            writeln!(f, "default roles: {}", self.default_roles.join(", "))?;
        }
        writeln!(f, "roles ({}):", self.roles.len())?;
        for r in &self.roles {
            let budget = r.max_tokens.map_or("-".to_owned(), |n| n.to_string());
            writeln!(
                f,
                "  {}: {} allow, {} deny, {} include, max_tokens {budget}",
                r.name, r.allow, r.deny, r.include
            )?;
        }
        writeln!(f, "users ({}):", self.users.len())?;
        for u in &self.users {
            let roles = if u.roles.is_empty() { "(no roles)".to_owned() } else { u.roles.join(", ") };
            writeln!(f, "  {}: {roles}", u.name)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Compiled form
// ---------------------------------------------------------------------------

/// The rules and extras of one role, or of one user's own entry.
#[derive(Debug, Default)]
struct Grant {
    allow: Vec<Rule>,
    deny: Vec<Rule>,
    max_tokens: Option<usize>,
    includes: Vec<Include>,
}

impl Grant {
    fn rules(&self, effect: Effect) -> &[Rule] {
        match effect {
            Effect::Allow => &self.allow,
            Effect::Deny => &self.deny,
        }
    }
}

#[derive(Debug)]
struct UserEntry {
    roles: Vec<String>,
    own: Arc<Grant>,
}

#[derive(Debug)]
struct Rule {
    server: Pattern,
    uri: Pattern,
    mime: Option<Pattern>,
    reference: RuleRef,
}

impl Rule {
    fn matches(&self, r: &Resource) -> bool {
        self.server.is_match(&r.id.server)
            && self.uri.is_match(&canonical_uri(&r.id.uri))
            && match &self.mime {
                None => true,
                Some(p) => r.mime_type.as_deref().is_some_and(|m| p.is_match(m)),
            }
    }
}

/// An `include` entry, validated: `server` is a valid server name, `uri` is a
/// valid URI once `{user}` is replaced.
#[derive(Debug, Clone)]
struct Include {
    server: String,
    uri: String,
}

/// A compiled glob with its source text.
#[derive(Debug, Clone)]
struct Pattern {
    text: String,
    matcher: Matcher,
}

#[derive(Debug, Clone)]
enum Matcher {
    /// `**`: everything.
    Any,
    /// `*`: anything without `/`.
    NoSlash,
    /// Any of these (see the module doc for why there may be several).
    Globs(Vec<GlobMatcher>),
}

impl Pattern {
    fn any() -> Self {
        Pattern { text: "**".into(), matcher: Matcher::Any }
    }

    fn compile(text: &str) -> std::result::Result<Self, String> {
        Self::compile_as(text, text)
    }

    /// A `uri` glob: matched against canonical URIs, so its own scheme and
    /// host are lower-cased first (`SECRET://**` is `secret://**`).
    fn compile_uri(text: &str) -> std::result::Result<Self, String> {
        Self::compile_as(text, &canonical_glob(text))
    }

    /// Compiles `glob`, shown to people as `text`.
    fn compile_as(text: &str, glob_src: &str) -> std::result::Result<Self, String> {
        let text_shown = text;
        let text = glob_src;
        let matcher = if text.len() >= 2 && text.bytes().all(|b| b == b'*') {
            Matcher::Any
        } else if text == "*" {
            Matcher::NoSlash
        } else {
            let pieces = split_star_runs(text);
            let runs = pieces.len() - 1;
            if runs > MAX_RECURSIVE_RUNS {
                return Err(format!(
                    "glob {} has {runs} `**`; at most {MAX_RECURSIVE_RUNS} are allowed (split it into several rules)",
                    quote(text)
                ));
            }
            let mut globs = Vec::with_capacity(1 << runs);
            for mask in 0..(1usize << runs) {
                // `pieces` is never empty: split_star_runs always pushes the tail.
                let mut glob = String::from(pieces[0]);
                for (i, piece) in pieces[1..].iter().enumerate() {
                    glob.push_str(if mask & (1 << i) == 0 { "*" } else { "*/**/*" });
                    glob.push_str(piece);
                }
                let compiled =
                    GlobBuilder::new(&glob).literal_separator(true).backslash_escape(true).build().map_err(|e| {
                        let kind = e.kind().to_string();
                        format!(
                            "invalid glob {}: {kind} (write `\\[`, `\\*`, `\\?`, `\\{{` for literal characters)",
                            quote(text)
                        )
                    })?;
                globs.push(compiled.compile_matcher());
            }
            Matcher::Globs(globs)
        };
        Ok(Pattern { text: text_shown.to_owned(), matcher })
    }

    fn is_match(&self, s: &str) -> bool {
        match &self.matcher {
            Matcher::Any => true,
            Matcher::NoSlash => !s.contains('/'),
            Matcher::Globs(globs) => globs.iter().any(|g| g.is_match(s)),
        }
    }
}

/// Splits `p` at every run of two or more unescaped `*` outside a `[...]`
/// class, returning the pieces between runs. All the bytes looked at are
/// ASCII, so the slice indices always fall on char boundaries.
fn split_star_runs(p: &str) -> Vec<&str> {
    let b = p.as_bytes();
    let (mut pieces, mut start, mut i) = (Vec::new(), 0, 0);
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'[' => i = class_end(b, i),
            b'*' => {
                let run = b[i..].iter().take_while(|&&c| c == b'*').count();
                if run >= 2 {
                    pieces.push(&p[start..i]);
                    start = i + run;
                }
                i += run;
            }
            _ => i += 1,
        }
    }
    pieces.push(&p[start..]);
    pieces
}

/// Index just past the `]` closing the class opened at `open`, following
/// globset's rules (`]` first is literal; `[:name:]` is a POSIX class);
/// `b.len()` for an unclosed class, which globset then rejects.
fn class_end(b: &[u8], open: usize) -> usize {
    let mut i = open + 1;
    if matches!(b.get(i), Some(b'!' | b'^')) {
        i += 1;
    }
    if b.get(i) == Some(&b']') {
        i += 1;
    }
    while i < b.len() {
        match b[i] {
            b']' => return i + 1,
            b'[' if b.get(i + 1) == Some(&b':') => {
                let name_len = b[i + 2..].iter().take_while(|c| c.is_ascii_lowercase()).count();
                let end = i + 2 + name_len;
                i = if b.get(end..end + 2) == Some(b":]") { end + 2 } else { i + 1 };
            }
            _ => i += 1,
        }
    }
    b.len()
}

// ---------------------------------------------------------------------------
// Raw (file) form: deserialized straight from the text so that serde_yaml
// reports line and column. Patterns, includes and budgets are validated
// while deserializing, so their errors point at the offending value.
// ---------------------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a policy: a mapping with default_roles, roles and users")]
struct RawFile {
    #[serde(default)]
    default_roles: Option<Vec<String>>,
    #[serde(default)]
    roles: Entries<RawRole>,
    #[serde(default)]
    users: Entries<RawUser>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a role: a mapping with allow, deny, max_tokens, include")]
struct RawRole {
    #[serde(default, deserialize_with = "null_as_default")]
    allow: Vec<RawRule>,
    #[serde(default, deserialize_with = "null_as_default")]
    deny: Vec<RawRule>,
    #[serde(default)]
    max_tokens: Option<MaxTokens>,
    #[serde(default, deserialize_with = "null_as_default")]
    include: Vec<Include>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a user: a mapping with roles, allow, deny, max_tokens, include")]
struct RawUser {
    #[serde(default, deserialize_with = "null_as_default")]
    roles: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    allow: Vec<RawRule>,
    #[serde(default, deserialize_with = "null_as_default")]
    deny: Vec<RawRule>,
    #[serde(default)]
    max_tokens: Option<MaxTokens>,
    #[serde(default, deserialize_with = "null_as_default")]
    include: Vec<Include>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a rule: a mapping such as { server: demo, uri: \"demo://**\" }")]
struct RawRule {
    server: Option<Pattern>,
    uri: Option<UriPattern>,
    mime: Option<Pattern>,
}

/// A `uri` glob, compiled for canonical URIs (see [`Pattern::compile_uri`]).
struct UriPattern(Pattern);

/// `max_tokens`, at least 1.
struct MaxTokens(usize);

/// A YAML mapping kept in file order, remembering the first duplicate key
/// (serde's maps silently keep the last, which would hide a mistake).
struct Entries<T> {
    items: Vec<(String, T)>,
    duplicate: Option<String>,
}

impl<T> Default for Entries<T> {
    fn default() -> Self {
        Entries { items: Vec::new(), duplicate: None }
    }
}

/// Lets `key:` with no value mean "empty" rather than a type error.
fn null_as_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Entries<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for V<T> {
            type Value = Entries<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping of names to definitions")
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
                Ok(Entries::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
                let mut out = Entries::default();
                while let Some(key) = map.next_key::<String>()? {
                    let value = map.next_value::<Option<T>>()?.unwrap_or_default();
                    if out.duplicate.is_none() && out.items.iter().any(|(k, _)| *k == key) {
                        out.duplicate = Some(key.clone());
                    }
                    out.items.push((key, value));
                }
                Ok(out)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for Pattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_str(PatternVisitor(Pattern::compile))
    }
}

impl<'de> Deserialize<'de> for UriPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_str(PatternVisitor(Pattern::compile_uri)).map(UriPattern)
    }
}

/// Compiles a glob while deserializing it.
struct PatternVisitor(fn(&str) -> std::result::Result<Pattern, String>);

impl Visitor<'_> for PatternVisitor {
    type Value = Pattern;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a glob pattern string")
    }
    // Validating inside the visitor makes serde_yaml blame the scalar's position.
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Pattern, E> {
        (self.0)(v).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for Include {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Include;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a SERVER:URI string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Include, E> {
                parse_include(v).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

fn parse_include(text: &str) -> std::result::Result<Include, String> {
    let hint = "an include is SERVER:URI, e.g. `crm:crm://users/{user}/profile`";
    if text.split_once(':').is_some_and(|(server, _)| server.contains(USER_PLACEHOLDER)) {
        return Err(format!("invalid include {}: `{{user}}` may appear only in the URI; {hint}", quote(text)));
    }
    match ResourceId::parse(&text.replace(USER_PLACEHOLDER, "user")) {
        // The server part has no placeholder (checked above), so `id.server` is
        // it verbatim; keep the URI part unexpanded for `for_user`.
        Ok(id) => Ok(Include { server: id.server, uri: text.split_once(':').map_or("", |(_, u)| u).to_owned() }),
        Err(Error::InvalidId { reason, .. }) => Err(format!("invalid include {}: {reason}; {hint}", quote(text))),
        Err(e) => Err(format!("invalid include {}: {e}; {hint}", quote(text))),
    }
}

impl<'de> Deserialize<'de> for MaxTokens {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        const ZERO: &str = "max_tokens must be at least 1; remove it to use the configured context.max_tokens";
        impl Visitor<'_> for V {
            type Value = MaxTokens;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a positive number of tokens")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<MaxTokens, E> {
                match usize::try_from(v) {
                    Ok(0) => Err(E::custom(ZERO)),
                    Ok(n) => Ok(MaxTokens(n)),
                    Err(_) => Err(E::custom("max_tokens is too large")),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<MaxTokens, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(ZERO)),
                }
            }
        }
        d.deserialize_u64(V)
    }
}

// ---------------------------------------------------------------------------
// Loading and merging
// ---------------------------------------------------------------------------

fn policy_error(path: &Path, at: Option<(usize, usize)>, message: String) -> Error {
    Error::Policy { path: path.to_path_buf(), line: at.map(|a| a.0), column: at.map(|a| a.1), message }
}

fn parse_file(path: &Path, src: &str) -> Result<RawFile> {
    serde_yaml::from_str::<RawFile>(src).map_err(|e| {
        let mut at = e.location().map(|l| (l.line(), l.column()));
        let mut message = e.to_string();
        if let Some((line, column)) = at {
            message = message.replacen(&format!(" at line {line} column {column}"), "", 1);
        }
        // serde blames the start of the mapping for a repeated key; point at the repeat.
        if let Some((prefix, rest)) = message.split_once("duplicate field `")
            && let Some((field, _)) = rest.split_once('`')
            && !prefix.contains('[')
        {
            let mut path: Vec<&str> = prefix.trim_end_matches(": ").split('.').filter(|k| !k.is_empty()).collect();
            path.push(field);
            let loc = Locator::new(src);
            at = loc.keys(&path).get(1).and_then(|&l| loc.position(l)).or(at);
        }
        if message.contains("anchor") || message.contains("alias") {
            message.push_str(" (a glob starting with `*` must be quoted: server: \"*\")");
        }
        policy_error(path, at, message)
    })
}

/// Merges and compiles files already read: `(path, text)` in merge order.
fn build(files: &[(PathBuf, String)]) -> Result<Policy> {
    let mut default_roles: Option<(Vec<String>, usize)> = None;
    let mut roles: BTreeMap<String, (Arc<Grant>, usize)> = BTreeMap::new();
    let mut users: BTreeMap<String, (UserEntry, usize)> = BTreeMap::new();
    for (i, (path, text)) in files.iter().enumerate() {
        let raw = parse_file(path, text)?;
        let loc = Locator::new(text);
        for (section, dup) in [("roles", &raw.roles.duplicate), ("users", &raw.users.duplicate)] {
            if let Some(name) = dup {
                let at = loc.keys(&[section, name]).get(1).and_then(|&l| loc.position(l));
                let what = &section[..section.len() - 1];
                let msg = format!("{what} `{name}` is defined twice in this file; keep one definition");
                return Err(policy_error(path, at, msg));
            }
        }
        if let Some(new) = raw.default_roles {
            match &default_roles {
                Some((old, j)) if *old != new => {
                    let msg = format!(
                        "default_roles is [{}] here but [{}] in {}; set it in one file only",
                        new.join(", "),
                        old.join(", "),
                        files[*j].0.display()
                    );
                    return Err(policy_error(path, loc.key(&["default_roles"]), msg));
                }
                Some(_) => {}
                None => default_roles = Some((new, i)),
            }
        }
        for (name, role) in raw.roles.items {
            if let Some((_, j)) = roles.get(&name) {
                let msg = format!(
                    "role `{name}` is already defined in {}; define each role in one file only",
                    files[*j].0.display()
                );
                return Err(policy_error(path, loc.key(&["roles", &name]), msg));
            }
            let owner = Owner { path, loc: &loc, section: "roles", name: &name };
            let grant = owner.grant(role.allow, role.deny, role.max_tokens, role.include);
            roles.insert(name, (Arc::new(grant), i));
        }
        for (name, user) in raw.users.items {
            if let Some((_, j)) = users.get(&name) {
                let msg = format!(
                    "user `{name}` is already defined in {}; define each user in one file only",
                    files[*j].0.display()
                );
                return Err(policy_error(path, loc.key(&["users", &name]), msg));
            }
            let owner = Owner { path, loc: &loc, section: "users", name: &name };
            let own = owner.grant(user.allow, user.deny, user.max_tokens, user.include);
            users.insert(name, (UserEntry { roles: dedup(user.roles), own: Arc::new(own) }, i));
        }
    }

    // Every role referenced must exist: a typo must not silently grant nothing
    // (or, worse, be "fixed" later by someone defining a role of that name).
    let defined = || roles.keys().cloned().collect::<Vec<_>>().join(", ");
    for (name, (entry, i)) in &users {
        if let Some(missing) = entry.roles.iter().find(|r| !roles.contains_key(*r)) {
            let (path, text) = &files[*i];
            let at = Locator::new(text).value(&["users", name, "roles"], missing);
            let msg = format!(
                "user `{name}` has role `{missing}`, which no policy file defines (defined: {}); \
                 define it under `roles:` or fix the name",
                defined()
            );
            return Err(policy_error(path, at, msg));
        }
    }
    let (default_roles, i) = default_roles.unwrap_or_default();
    if let Some(missing) = default_roles.iter().find(|r| !roles.contains_key(*r)) {
        let (path, text) = &files[i];
        let at = Locator::new(text).value(&["default_roles"], missing);
        let msg = format!(
            "default_roles names `{missing}`, which no policy file defines (defined: {}); \
             define it under `roles:` or fix the name",
            defined()
        );
        return Err(policy_error(path, at, msg));
    }
    Ok(Policy {
        files: files.iter().map(|(p, _)| p.clone()).collect(),
        default_roles: dedup(default_roles),
        roles: roles.into_iter().map(|(k, (g, _))| (k, g)).collect(),
        users: users.into_iter().map(|(k, (u, _))| (k, u)).collect(),
    })
}

/// `v` without repeats, first occurrences kept in order.
fn dedup<T: PartialEq>(v: Vec<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len());
    for x in v {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    out
}

/// A role or user being compiled, with what is needed to locate its rules.
struct Owner<'a> {
    path: &'a Path,
    loc: &'a Locator<'a>,
    section: &'a str,
    name: &'a str,
}

impl Owner<'_> {
    fn grant(&self, allow: Vec<RawRule>, deny: Vec<RawRule>, max: Option<MaxTokens>, include: Vec<Include>) -> Grant {
        Grant {
            allow: self.rules(allow, Effect::Allow),
            deny: self.rules(deny, Effect::Deny),
            max_tokens: max.map(|m| m.0),
            includes: include,
        }
    }

    fn rules(&self, raw: Vec<RawRule>, effect: Effect) -> Vec<Rule> {
        let key = effect.to_string();
        let key_line = self.loc.key(&[self.section, self.name, &key]).map(|a| a.0);
        let owner = format!("{} {}", &self.section[..self.section.len() - 1], self.name);
        raw.into_iter()
            .enumerate()
            .map(|(index, r)| {
                let reference = RuleRef {
                    file: self.path.to_path_buf(),
                    line: key_line.map(|l| self.loc.item_line(l - 1, index) + 1),
                    owner: owner.clone(),
                    effect,
                    index,
                    rule: canonical(&r),
                };
                Rule {
                    server: r.server.unwrap_or_else(|| Pattern { text: "*".into(), matcher: Matcher::NoSlash }),
                    uri: r.uri.map_or_else(Pattern::any, |u| u.0),
                    mime: r.mime,
                    reference,
                }
            })
            .collect()
    }
}

/// The rule as written: the fields given, in a fixed order, quoted.
fn canonical(r: &RawRule) -> String {
    let fields: Vec<String> =
        [("server", r.server.as_ref()), ("uri", r.uri.as_ref().map(|u| &u.0)), ("mime", r.mime.as_ref())]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|p| format!("{k}: {}", json_quote(&p.text))))
            .collect();
    if fields.is_empty() { "{}".into() } else { format!("{{ {} }}", fields.join(", ")) }
}

fn json_quote(s: &str) -> String {
    // Serializing a &str to JSON cannot fail; fall back to Debug just in case.
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

// ---------------------------------------------------------------------------
// Best-effort line finding
// ---------------------------------------------------------------------------

/// Finds the lines of keys and list items in block-style YAML text, for errors
/// and rule references that serde cannot locate (undefined roles, duplicate
/// definitions, rule positions). It understands the usual layout: nested
/// `key:` mappings by indentation, `- ` items (indented or not), and flow
/// lists/mappings on one line. Anything else (a policy written entirely in
/// flow style, keys split over lines) yields `None` or the nearest key line.
struct Locator<'a> {
    /// Per line: indentation and content, or `None` for blank/comment lines.
    lines: Vec<Option<(usize, &'a str)>>,
}

impl<'a> Locator<'a> {
    fn new(text: &'a str) -> Self {
        let lines = text
            .lines()
            .map(|l| {
                let content = l.trim_start_matches(' ');
                let c = content.trim_end();
                (!c.is_empty() && !c.starts_with('#') && c != "---").then(|| (l.len() - content.len(), c))
            })
            .collect();
        Locator { lines }
    }

    /// 1-based line and column of the first occurrence of the key path.
    fn key(&self, path: &[&str]) -> Option<(usize, usize)> {
        self.position(*self.keys(path).first()?)
    }

    /// 1-based line and column of the content of the 0-based `line`.
    fn position(&self, line: usize) -> Option<(usize, usize)> {
        self.lines.get(line).copied().flatten().map(|(indent, _)| (line + 1, indent + 1))
    }

    /// 0-based lines of every occurrence of the last key of `path`, following
    /// the first occurrence of each earlier key.
    fn keys(&self, path: &[&str]) -> Vec<usize> {
        let (mut from, mut to) = (0, self.lines.len());
        let mut found = Vec::new();
        for (depth, want) in path.iter().enumerate() {
            let Some(indent) = (from..to).find_map(|i| self.lines[i].map(|(ind, _)| ind)) else {
                return Vec::new();
            };
            found = (from..to)
                .filter(|&i| {
                    matches!(self.lines[i], Some((ind, c)) if ind == indent && mapping_key(c).is_some_and(|(k, _)| k == *want))
                })
                .collect();
            let Some(&line) = found.first() else {
                return Vec::new();
            };
            if depth + 1 < path.len() {
                from = line + 1;
                to = (from..to).find(|&i| matches!(self.lines[i], Some((ind, _)) if ind <= indent)).unwrap_or(to);
            }
        }
        found
    }

    /// 0-based line of item `index` of the list under the key on `key_line`;
    /// the key line itself for a flow list or when the item is not found.
    fn item_line(&self, key_line: usize, index: usize) -> usize {
        self.items(key_line).get(index).copied().unwrap_or(key_line)
    }

    /// 0-based lines of the `- ` items of the block list under `key_line`.
    fn items(&self, key_line: usize) -> Vec<usize> {
        let Some((indent, _)) = self.lines.get(key_line).copied().flatten() else {
            return Vec::new();
        };
        let mut item_indent = None;
        let mut items = Vec::new();
        for i in key_line + 1..self.lines.len() {
            let Some((ind, c)) = self.lines[i] else {
                continue;
            };
            let is_item = c == "-" || c.starts_with("- ");
            if ind < indent || (ind == indent && !is_item) || (item_indent.is_none() && !is_item) {
                break;
            }
            let item_ind = *item_indent.get_or_insert(ind);
            if ind < item_ind {
                break;
            }
            if ind == item_ind && is_item {
                items.push(i);
            }
        }
        items
    }

    /// 1-based line and column of `value` in the list under the key `path`
    /// (a flow list on the key's line or `- value` items), else the key's.
    fn value(&self, path: &[&str], value: &str) -> Option<(usize, usize)> {
        let key_line = *self.keys(path).first()?;
        let (indent, content) = self.lines[key_line]?;
        let rest_start = mapping_key(content).map_or(0, |(_, rest)| content.len() - rest.len());
        let rest = &content[rest_start..];
        if let Some(col) = find_word(rest.split(" #").next().unwrap_or(rest), value) {
            return Some((key_line + 1, indent + rest_start + col + 1));
        }
        for i in self.items(key_line) {
            if let Some((ind, c)) = self.lines[i] {
                let item = c[1..].trim_start();
                if unquote(item.split(" #").next().unwrap_or(item).trim_end()) == value {
                    return Some((i + 1, ind + c.len() - item.len() + 1));
                }
            }
        }
        Some((key_line + 1, indent + 1))
    }
}

/// Splits `key: rest` (key possibly quoted); `None` for list items and
/// non-key lines.
fn mapping_key(content: &str) -> Option<(&str, &str)> {
    if content == "-" || content.starts_with("- ") {
        return None;
    }
    let (key, rest) = match content.chars().next() {
        Some(q @ ('"' | '\'')) => {
            let end = content[1..].find(q)? + 1;
            (&content[1..end], content[end + 1..].strip_prefix(':')?)
        }
        _ => {
            let colon = content
                .match_indices(':')
                .find(|(i, _)| content[i + 1..].is_empty() || content[i + 1..].starts_with(' '))?;
            (content[..colon.0].trim_end(), &content[colon.0 + 1..])
        }
    };
    (rest.is_empty() || rest.starts_with(' ')).then_some((key, rest))
}

/// Byte offset of `word` in `s` where it is not part of a longer name.
fn find_word(s: &str, word: &str) -> Option<usize> {
    let is_name = |c: char| c.is_alphanumeric() || c == '-' || c == '_';
    s.match_indices(word).map(|(i, _)| i).find(|&i| {
        !s[..i].chars().next_back().is_some_and(is_name) && !s[i + word.len()..].chars().next().is_some_and(is_name)
    })
}

fn unquote(s: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The demo policy; it moves to `policies/default.yaml` in the real crate.
    const DEFAULT_POLICY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/policies/default.yaml");

    fn res(id: &str) -> Resource {
        Resource::unlisted(ResourceId::parse(id).unwrap())
    }

    fn res_mime(id: &str, mime: &str) -> Resource {
        Resource { mime_type: Some(mime.into()), ..res(id) }
    }

    fn policy(src: &str) -> Policy {
        Policy::from_yaml(src, Path::new("p.yaml")).unwrap_or_else(|e| panic!("{e}"))
    }

    fn sees(p: &Policy, user: &str, r: &Resource) -> bool {
        p.for_user(user).decide(r).allowed
    }

    /// (line, column, message, full display) of a load error.
    fn err_of(e: Error) -> (Option<usize>, Option<usize>, String, String) {
        let shown = e.to_string();
        match e {
            Error::Policy { line, column, message, .. } => (line, column, message, shown),
            other => panic!("not a policy error: {other}"),
        }
    }

    fn load_err(src: &str) -> (Option<usize>, Option<usize>, String, String) {
        let e = err_of(Policy::from_yaml(src, Path::new("bad.yaml")).expect_err("should fail"));
        assert!(e.3.starts_with("bad.yaml:"), "names the file and line: {}", e.3);
        e
    }

    fn m(pattern: &str, s: &str) -> bool {
        Pattern::compile(pattern).unwrap_or_else(|e| panic!("{e}")).is_match(s)
    }

    // ---- glob semantics ---------------------------------------------------

    #[test]
    fn star_stays_within_a_segment() {
        assert!(m("demo://*", "demo://a"));
        assert!(m("demo://*", "demo://"));
        assert!(!m("demo://*", "demo://a/b"));
        assert!(m("*.png", "logo.png"));
        assert!(!m("*.png", "img/logo.png"));
        assert!(m("*", "demo"));
        assert!(!m("*", "a/b"));
        assert!(m("image/*", "image/png"));
        assert!(!m("image/*", "image/png/x"));
    }

    #[test]
    fn double_star_crosses_slashes_anywhere() {
        assert!(m("**", ""));
        assert!(m("**", "a/b/c"));
        assert!(m("demo://public/**", "demo://public/a/b"));
        assert!(m("demo://public/**", "demo://public/faq"));
        assert!(!m("demo://public/**", "demo://publicity"));
        assert!(m("secret://**", "secret://payroll/2026"));
        assert!(!m("secret://**", "secrets://x"));
        // In the middle: any run including `/`, possibly empty.
        assert!(m("a/**/b", "a/x/b"));
        assert!(m("a/**/b", "a/x/y/b"));
        assert!(m("a/**/b", "a//b"));
        assert!(!m("a/**/b", "a/x/c"));
        // globset would match these zero-segment cases; the spec says `**` is a
        // run between the literal slashes, so both slashes must be there.
        assert!(!m("a/**/b", "a/b"));
        assert!(!m("**/foo", "foo"));
        assert!(m("**/foo", "/foo"));
        assert!(m("**/foo", "x/y/foo"));
    }

    #[test]
    fn double_star_not_next_to_a_slash_still_crosses() {
        // globset treats these as `*`; the spec wins.
        assert!(m("x**", "x/a/b"));
        assert!(m("x**", "x"));
        assert!(m("**x", "a/b/x"));
        assert!(m("a**b", "a/c/d/b"));
        assert!(m("a**b", "ab"));
        assert!(!m("a**b", "a/c/d/bc"));
        assert!(m("secret:**", "secret://payroll/2026"));
        assert!(m("***", "a/b"));
        assert!(m("a***b", "a/x/b"));
        assert!(m("**a**", "x/y/a/z/w"));
        assert!(!m("**a**", "x/y/z"));
        assert!(m("d*/**/*x", "dm/a/b/cx"));
        assert!(m("{a,b}**", "b/c/d"));
    }

    #[test]
    fn question_mark_and_classes() {
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
        assert!(!m("a?c", "abbc"));
        assert!(!m("a?c", "a/c"), "`?` does not match `/`");
        assert!(!m("a?c", "aéc"), "`?` is one byte, so one ASCII character");
        assert!(m("[ab]x", "ax"));
        assert!(m("[ab]x", "bx"));
        assert!(!m("[ab]x", "cx"));
        assert!(m("[a-c]x", "bx"));
        assert!(m("[!a]x", "bx"));
        assert!(!m("[!a]x", "ax"));
        assert!(!m("[!a]x", "/x"));
        // Stars inside a class are literal, not `**`.
        assert!(m("[*]x", "*x"));
        assert!(m("[**]**", "*/a/b"));
        assert!(!m("[**]**", "a/b"));
        assert!(m("[[:digit:]]**", "7/a"));
    }

    #[test]
    fn case_sensitive_whole_string_and_escapes() {
        assert!(!m("demo://*", "Demo://a"));
        assert!(!m("Image/*", "image/png"));
        assert!(!m("demo", "demo2"));
        assert!(!m("demo", "xdemo"));
        assert!(!m("demo://a", "demo://a/b"));
        assert!(m(r"a\*b", "a*b"));
        assert!(!m(r"a\*b", "axb"));
        assert!(m(r"a\*\*b", "a**b"));
        assert!(!m(r"a\*\*b", "a/b"));
        assert!(m(r"u/\{user\}", "u/{user}"));
    }

    #[test]
    fn bad_globs_are_rejected() {
        for bad in ["[abc", "a\\", "a/**/**/**/**/**"] {
            assert!(Pattern::compile(bad).is_err(), "{bad}");
        }
        assert!(Pattern::compile("a/**/**/**/**").is_ok());
    }

    // ---- decisions ----------------------------------------------------------

    const TWO_ROLES: &str = r#"
roles:
  reader:
    allow:
      - { server: demo, uri: "demo://**" }
  cautious:
    deny:
      - { uri: "demo://private/**" }
users:
  ann: { roles: [reader, cautious] }
  ben:
    roles: [reader]
    deny:
      - { uri: "demo://docs/draft" }
  cid:
    allow:
      - { server: crm, uri: "crm://cid/**" }
"#;

    #[test]
    fn deny_in_one_role_beats_allow_in_another() {
        let p = policy(TWO_ROLES);
        let ann = p.for_user("ann");
        assert!(ann.decide(&res("demo:demo://docs/a")).allowed);
        let d = ann.decide(&res("demo:demo://private/x"));
        assert!(!d.allowed);
        let rule = d.rule.as_ref().unwrap();
        assert_eq!((rule.owner.as_str(), rule.effect, rule.index), ("role cautious", Effect::Deny, 0));
        assert_eq!(d.detail(), r#"denied by p.yaml:8: role cautious deny[0] { uri: "demo://private/**" }"#);
        let ok = ann.decide(&res("demo:demo://docs/a"));
        assert_eq!(ok.detail(), r#"allowed by p.yaml:5: role reader allow[0] { server: "demo", uri: "demo://**" }"#);
    }

    #[test]
    fn users_own_rules_count() {
        let p = policy(TWO_ROLES);
        assert!(sees(&p, "ben", &res("demo:demo://docs/a")));
        assert!(sees(&p, "ben", &res("demo:demo://private/x")));
        let d = p.for_user("ben").decide(&res("demo:demo://docs/draft"));
        assert!(!d.allowed);
        assert_eq!(d.rule.unwrap().owner, "user ben");
        assert!(sees(&p, "cid", &res("crm:crm://cid/notes")));
        assert!(!sees(&p, "cid", &res("crm:crm://dan/notes")));
        assert!(!sees(&p, "cid", &res("demo:demo://docs/a")));
        assert!(p.for_user("cid").roles().is_empty());
        assert!(p.for_user("cid").is_known());
    }

    #[test]
    fn unknown_users_get_default_roles_or_nothing() {
        let with = policy("default_roles: [public]\nroles:\n  public:\n    allow: [{ uri: \"demo://public/**\" }]\n");
        let u = with.for_user("stranger");
        assert!(!u.is_known());
        assert_eq!(u.roles(), ["public"]);
        assert!(u.decide(&res("demo:demo://public/faq")).allowed);
        let d = u.decide(&res("demo:demo://docs/guide"));
        assert_eq!(d, Decision { allowed: false, rule: None });
        assert_eq!(d.detail(), "no allow rule matches");
        assert_eq!(u.explain(&d), "no allow rule matches (user stranger (not listed under users), roles: public)");

        for src in ["roles:\n  public:\n    allow: [{}]\n", "default_roles: []\nroles:\n  public:\n    allow: [{}]\n"] {
            let without = policy(src);
            let u = without.for_user("stranger");
            assert!(u.roles().is_empty());
            assert!(!u.decide(&res("demo:demo://public/faq")).allowed);
            assert!(u.explain(&u.decide(&res("demo:x"))).ends_with("roles: none)"));
        }
    }

    #[test]
    fn empty_policy_shows_nothing() {
        for src in ["", "# nothing\n", "roles:\nusers:\n"] {
            let p = policy(src);
            assert!(!sees(&p, "anyone", &res("demo:demo://public/faq")));
            assert_eq!(p.for_user("anyone").max_tokens(), None);
            assert!(p.for_user("anyone").includes().is_empty());
        }
    }

    #[test]
    fn allow_all_allows_everything() {
        let p = Policy::allow_all();
        for r in [res("demo:demo://a"), res("x:secret://a/b/c"), res_mime("d:z", "image/png")] {
            let d = p.for_user("whoever").decide(&r);
            assert!(d.allowed, "{r:?}");
            assert!(d.detail().starts_with("allowed by (built-in allow-all policy)"), "{}", d.detail());
        }
        assert_eq!(p.for_user("x").max_tokens(), None);
    }

    #[test]
    fn mime_rules_need_a_listed_mime_type() {
        let p = policy(
            r#"
roles:
  r:
    allow:
      - { mime: "text/*" }
      - { uri: "img://**" }
    deny:
      - { mime: "image/*" }
users:
  u: { roles: [r] }
"#,
        );
        assert!(sees(&p, "u", &res_mime("s:doc://a", "text/plain")));
        assert!(!sees(&p, "u", &res_mime("s:doc://a", "application/json")));
        // No MIME type: the text/* allow cannot match...
        assert!(!sees(&p, "u", &res("s:doc://a")));
        // ...and neither can the image/* deny.
        assert!(sees(&p, "u", &res("s:img://logo")));
        assert!(!sees(&p, "u", &res_mime("s:img://logo", "image/png")));
    }

    #[test]
    fn budget_is_users_else_largest_of_roles_else_none() {
        let p = policy(
            r#"
roles:
  small: { max_tokens: 100 }
  big: { max_tokens: 900 }
  none: {}
users:
  own: { roles: [small, big], max_tokens: 50 }
  roles: { roles: [small, big, none] }
  nothing: { roles: [none] }
"#,
        );
        assert_eq!(p.for_user("own").max_tokens(), Some(50));
        assert_eq!(p.for_user("roles").max_tokens(), Some(900));
        assert_eq!(p.for_user("nothing").max_tokens(), None);
        assert_eq!(p.for_user("stranger").max_tokens(), None);
    }

    #[test]
    fn includes_expand_encoded_user_deduplicated_in_order() {
        let p = policy(
            r#"
roles:
  a:
    include: ["crm:crm://users/{user}/profile", "docs:docs://shared"]
  b:
    include: ["docs:docs://shared", "crm:crm://users/{user}/profile"]
users:
  "j doe/x":
    roles: [a, b]
    include: ["docs:docs://mine/{user}"]
"#,
        );
        let u = p.for_user("j doe/x");
        let got: Vec<String> = u.includes().iter().map(ToString::to_string).collect();
        assert_eq!(got, ["docs:docs://mine/j%20doe%2Fx", "crm:crm://users/j%20doe%2Fx/profile", "docs:docs://shared"]);
        // Unreserved characters stay, everything else (UTF-8 bytes too) is encoded.
        let odd = p.for_user("x~.-_é:");
        assert!(odd.includes().is_empty(), "not listed, no default roles");
        let p = policy("roles:\n  a:\n    include: [\"s:s://{user}\"]\nusers:\n  \"x~.-_é:\": { roles: [a] }\n");
        assert_eq!(p.for_user("x~.-_é:").includes()[0].uri, "s://x~.-_%C3%A9%3A");
        let p = policy("default_roles: [a]\nroles:\n  a:\n    include: [\"s:s://{user}/x\", \"s:s://fixed\"]\n");
        assert_eq!(p.for_user("..").includes(), [ResourceId::parse("s:s://fixed").unwrap()]);
        assert_eq!(p.for_user("...").includes()[0].uri, "s://.../x");
    }

    #[test]
    fn policy_is_send_sync_and_user_policy_is_cheap() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Policy>();
        assert_send_sync::<UserPolicy>();
        let p = policy(TWO_ROLES);
        let a = p.for_user("ann");
        let b = p.for_user("ann");
        assert!(Arc::ptr_eq(&a.grants[1], &b.grants[1]), "rules are shared, not recompiled");
    }

    // ---- rule references and lines --------------------------------------

    #[test]
    fn rule_lines_in_common_layouts() {
        let src = "roles:\n  r:\n    allow:\n    - uri: \"a\"\n      server: x\n    # a comment\n\n    - uri: \"b\"\n    deny: [{ uri: c }, { uri: d }]\nusers:\n  \"u\":\n    roles:\n      - r\n    deny:\n      -   { mime: \"x/*\" }\n";
        let p = policy(src);
        let u = p.for_user("u");
        let line = |effect: Effect, owner: &str, i: usize| {
            u.grants
                .iter()
                .flat_map(|g| g.rules(effect))
                .find(|r| r.reference.owner == owner && r.reference.index == i)
                .map(|r| r.reference.line)
                .unwrap()
        };
        assert_eq!(line(Effect::Allow, "role r", 0), Some(4));
        assert_eq!(line(Effect::Allow, "role r", 1), Some(8));
        assert_eq!(line(Effect::Deny, "role r", 1), Some(9));
        assert_eq!(line(Effect::Deny, "user u", 0), Some(15));
        let d = u.decide(&res_mime("x:b", "x/y"));
        assert_eq!(d.rule.unwrap().to_string(), "p.yaml:15: user u deny[0] { mime: \"x/*\" }");
        // Flow style everywhere: no line, but still a reference.
        let p = policy("{roles: {r: {allow: [{uri: a}]}}, users: {u: {roles: [r]}}}");
        let d = p.for_user("u").decide(&res("s:a"));
        assert_eq!(d.rule.unwrap().to_string(), "p.yaml: role r allow[0] { uri: \"a\" }");
    }

    #[test]
    fn summary_lists_files_roles_and_users() {
        let s = policy(TWO_ROLES).summary();
        assert_eq!(s.files, [PathBuf::from("p.yaml")]);
        assert_eq!(s.roles.len(), 2);
        assert_eq!(s.roles[1], RoleSummary { name: "reader".into(), allow: 1, deny: 0, max_tokens: None, include: 0 });
        assert_eq!(s.users[0], UserSummary { name: "ann".into(), roles: vec!["reader".into(), "cautious".into()] });
        let text = s.to_string();
        for needle in [
            "policy files: p.yaml",
            "default roles: none",
            "cautious: 0 allow, 1 deny",
            "ann: reader, cautious",
            "cid: (no roles)",
        ] {
            assert!(text.contains(needle), "{needle} in\n{text}");
        }
    }

    // ---- loading errors ---------------------------------------------------

    #[test]
    fn invalid_yaml_names_file_and_line() {
        let (line, _, msg, shown) = load_err("roles:\n  staff:\n    allow: [\n      { uri: a }\n    deny: []\n");
        assert_eq!(line, Some(5), "{shown}");
        assert!(shown.starts_with("bad.yaml:5:"), "{shown}");
        assert!(!msg.contains("at line 5"), "location not repeated: {msg}");
        assert!(msg.contains("flow sequence at line 3"), "context kept: {msg}");
        let (line, _, msg, _) = load_err("roles:\n  r:\n    allow:\n      - { server: *, uri: a }\n");
        assert_eq!(line, Some(4));
        assert!(msg.contains("must be quoted"), "{msg}");
        let (_, _, msg, _) = load_err("- a\n- b\n");
        assert!(msg.contains("invalid type"), "{msg}");
    }

    #[test]
    fn unknown_key_names_file_and_line() {
        let (line, col, msg, _) = load_err("roles:\n  staff:\n    alow:\n      - { uri: a }\n");
        assert_eq!((line, col), (Some(3), Some(5)));
        assert!(msg.contains("unknown field `alow`") && msg.contains("`allow`"), "{msg}");
        let (line, _, msg, _) = load_err("roles:\n  r:\n    allow:\n      - { url: a }\n");
        assert_eq!(line, Some(4));
        assert!(msg.contains("`url`"), "{msg}");
        let (line, _, msg, _) = load_err("users:\n  a: {}\ngroups: {}\n");
        assert_eq!(line, Some(3));
        assert!(msg.contains("`groups`"), "{msg}");
    }

    #[test]
    fn undefined_role_names_the_reference() {
        let (line, col, msg, shown) = load_err("roles:\n  staff: {}\nusers:\n  alice:\n    roles: [staff, ghost]\n");
        assert_eq!((line, col), (Some(5), Some(20)), "{shown}");
        assert!(msg.contains("`ghost`") && msg.contains("alice") && msg.contains("defined: staff"), "{msg}");
        let (line, col, _, _) = load_err("users:\n  bob:\n    roles:\n      - \"ghost\"  # typo\n");
        assert_eq!((line, col), (Some(4), Some(9)));
        let (line, _, msg, _) = load_err("roles:\n  staff: {}\n\ndefault_roles: [guest]\n");
        assert_eq!(line, Some(4));
        assert!(msg.contains("default_roles") && msg.contains("`guest`"), "{msg}");
    }

    #[test]
    fn invalid_glob_points_at_the_value() {
        let (line, col, msg, _) = load_err("roles:\n  r:\n    allow:\n      - { server: demo, uri: \"[abc\" }\n");
        assert_eq!((line, col), (Some(4), Some(30)));
        assert!(msg.contains("invalid glob `[abc`") && msg.contains("unclosed"), "{msg}");
        let (line, _, msg, _) = load_err("roles:\n  r:\n    deny:\n      - mime: \"a/**/**/**/**/**\"\n");
        assert_eq!(line, Some(4));
        assert!(msg.contains("at most 4"), "{msg}");
    }

    #[test]
    fn bad_include_and_zero_budget_point_at_the_value() {
        let (line, _, msg, _) = load_err("roles:\n  r:\n    include:\n      - \"crm:ok\"\n      - \"no-colon\"\n");
        assert_eq!(line, Some(5));
        assert!(msg.contains("invalid include `no-colon`") && msg.contains("SERVER:URI"), "{msg}");
        let (line, _, msg, _) = load_err("users:\n  u:\n    include: [\"{user}:x\"]\n");
        assert_eq!(line, Some(3));
        assert!(msg.contains("only in the URI"), "{msg}");
        let (line, _, msg, _) = load_err("users:\n  u:\n    include: [\"s:a\\u0007b\"]\n");
        assert_eq!(line, Some(3));
        assert!(msg.contains("U+0007"), "{msg}");
        let (line, col, msg, _) = load_err("roles:\n  r:\n    max_tokens: 0\n");
        assert_eq!((line, col), (Some(3), Some(17)));
        assert!(msg.contains("at least 1"), "{msg}");
        let (line, _, _, _) = load_err("users:\n  u:\n    max_tokens: -5\n");
        assert_eq!(line, Some(3));
        let (line, _, msg, _) = load_err("users:\n  u:\n    max_tokens: lots\n");
        assert_eq!(line, Some(3));
        assert!(msg.contains("positive number"), "{msg}");
    }

    #[test]
    fn duplicates_within_a_file() {
        let (line, _, msg, _) = load_err("users:\n  alice: {}\n  bob: {}\n  alice:\n    roles: []\n");
        assert_eq!(line, Some(4));
        assert!(msg.contains("user `alice` is defined twice"), "{msg}");
        let (line, _, msg, _) = load_err("roles:\n  r: {}\n  'r': {}\n");
        assert_eq!(line, Some(3));
        assert!(msg.contains("role `r` is defined twice"), "{msg}");
        let (line, _, msg, _) = load_err("users: {}\nroles: {}\n\nusers:\n  a: {}\n");
        assert_eq!(line, Some(4));
        assert!(msg.contains("duplicate field `users`"), "{msg}");
        let (line, _, _, _) = load_err("roles:\n  r:\n    allow: []\n    deny: []\n    allow: []\n");
        assert_eq!(line, Some(5));
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn folder_merges_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "b.yml", "users:\n  bob: { roles: [r] }\n");
        write(dir.path(), "a.yaml", "default_roles: [r]\nroles:\n  r:\n    allow: [{ uri: \"x://**\" }]\n");
        write(dir.path(), "c.yaml", "default_roles: [r]\n");
        write(dir.path(), "notes.txt", "not: [yaml");
        write(dir.path(), ".hidden.yaml", "not: [yaml");
        std::fs::create_dir(dir.path().join("sub.yaml")).unwrap();
        let p = Policy::load(dir.path()).unwrap();
        let names: Vec<_> = p.summary().files.iter().map(|f| f.file_name().unwrap().to_owned()).collect();
        assert_eq!(names, ["a.yaml", "b.yml", "c.yaml"]);
        assert!(sees(&p, "bob", &res("s:x://1")));
        assert!(sees(&p, "stranger", &res("s:x://1")));
        let single = Policy::load(&dir.path().join("a.yaml")).unwrap();
        assert_eq!(single.summary().files.len(), 1);
    }

    #[test]
    fn user_or_role_in_two_files() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.yaml", "roles:\n  r: {}\nusers:\n  alice: { roles: [r] }\n");
        write(dir.path(), "b.yaml", "# second\nusers:\n  bob: {}\n  alice:\n    roles: [r]\n");
        let (line, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
        assert_eq!(line, Some(4));
        assert!(shown.contains("b.yaml:4:"), "{shown}");
        assert!(msg.contains("user `alice` is already defined in") && msg.contains("a.yaml"), "{msg}");

        write(dir.path(), "b.yaml", "\n\nroles:\n    r:\n        allow: []\n");
        let (line, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
        assert_eq!(line, Some(4));
        assert!(shown.contains("b.yaml:4:") && msg.contains("role `r` is already defined"), "{shown}");

        write(dir.path(), "a.yaml", "default_roles: [r]\nroles:\n  r: {}\n");
        write(dir.path(), "b.yaml", "roles:\n  s: {}\ndefault_roles: [s]\n");
        let (line, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
        assert_eq!(line, Some(3));
        assert!(shown.contains("b.yaml:3:") && msg.contains("set it in one file only"), "{shown}");
    }

    #[test]
    fn unreadable_or_empty_paths() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.yaml");
        let (line, _, msg, shown) = err_of(Policy::load(&missing).err().unwrap());
        assert_eq!(line, None);
        assert!(shown.starts_with(&missing.display().to_string()) && msg.contains("cannot read"), "{shown}");

        let (_, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
        assert!(msg.contains("no policy files") && shown.contains(&dir.path().display().to_string()), "{shown}");

        let bad = write(dir.path(), "bin.yaml", "");
        std::fs::write(&bad, [0xff, 0xfe, 0x00]).unwrap();
        let (_, _, msg, shown) = err_of(Policy::load(dir.path()).err().unwrap());
        assert!(msg.contains("cannot read policy file") && shown.contains("bin.yaml"), "{shown}");
    }

    // ---- the demo policy ----------------------------------------------------

    #[test]
    fn the_demo_policy_shows_each_user_their_resources() {
        let p = Policy::load(Path::new(DEFAULT_POLICY)).unwrap_or_else(|e| panic!("{e}"));
        let guide = res_mime("demo:demo://docs/guide", "text/markdown");
        let changelog = res("demo:demo://docs/changelog");
        let faq = res_mime("demo:demo://public/faq", "text/plain");
        let logo = res_mime("demo:demo://images/logo.png", "image/png");
        let banner = res("demo:demo://ui/welcome-banner");
        let notes = res("demo:demo://notes/low-priority");
        let payroll = res_mime("demo:secret://payroll/2026", "text/plain");
        let profile = |u: &str| res(&format!("demo:demo://users/{u}/profile"));
        let all = [&guide, &changelog, &faq, &logo, &banner, &notes, &payroll];
        let visible = |user: &str| -> Vec<bool> {
            let u = p.for_user(user);
            all.iter().map(|r| u.decide(r).allowed).collect()
        };
        //                               guide  changelog faq   logo   banner notes  payroll
        assert_eq!(visible("alice"), [true, true, true, false, true, true, false]);
        assert_eq!(visible("bob"), [true, true, true, false, false, false, false]);
        assert_eq!(visible("carol"), [true, true, true, false, true, true, true]);
        assert_eq!(visible("dave"), [false, false, true, false, false, false, false]);

        let alice = p.for_user("alice");
        assert_eq!(alice.max_tokens(), Some(3000));
        assert_eq!(alice.includes(), [ResourceId::parse("demo:demo://users/alice/profile").unwrap()]);
        assert!(alice.decide(&profile("alice")).allowed);
        let denied = alice.decide(&payroll).detail();
        assert!(
            denied.starts_with("denied by ") && denied.ends_with("role staff deny[0] { uri: \"secret://**\" }"),
            "{denied}"
        );
        let text = std::fs::read_to_string(DEFAULT_POLICY).unwrap();
        let want = text.lines().position(|l| l.contains("- { uri: \"secret://**\" }")).unwrap() + 1;
        assert_eq!(alice.decide(&payroll).rule.unwrap().line, Some(want));

        let bob = p.for_user("bob");
        assert_eq!(bob.includes(), [ResourceId::parse("demo:demo://users/bob/profile").unwrap()]);
        assert!(bob.decide(&profile("bob")).allowed);
        assert!(!bob.decide(&profile("alice")).allowed);
        assert_eq!(bob.max_tokens(), Some(1500));

        let carol = p.for_user("carol");
        assert_eq!(carol.roles(), ["hr"]);
        assert!(carol.decide(&profile("carol")).allowed);
        assert_eq!(carol.includes(), [ResourceId::parse("demo:demo://users/carol/profile").unwrap()]);

        let dave = p.for_user("dave");
        assert!(!dave.is_known());
        assert_eq!(dave.roles(), ["guest"]);
        assert_eq!(dave.max_tokens(), Some(500));
        assert!(dave.includes().is_empty());
        assert!(!dave.decide(&profile("dave")).allowed);
    }

    // ---- property: decide == the definition --------------------------------

    const SERVER_GLOBS: &[&str] = &["*", "**", "demo", "d*", "crm", "?rm", "[cd]*"];
    const URI_GLOBS: &[&str] = &[
        "**",
        "demo://**",
        "demo://*",
        "demo://a/**",
        "demo://a/*",
        "*://a/**",
        "secret://**",
        "**/b",
        "demo://?/b",
        "demo://[ab]/**",
        "demo://[!a]/*",
        "x**",
        "demo**b",
        "demo://a/**/b",
        "**a**",
        "SECRET://**",
        "Demo://A/**",
    ];
    const MIME_GLOBS: &[&str] = &["image/*", "text/*", "*", "**", "*/p*"];
    const SERVERS: &[&str] = &["demo", "crm", "d"];
    const URIS: &[&str] = &[
        "demo://a",
        "demo://a/b",
        "demo://b/b",
        "demo://a/x/b",
        "demo://c",
        "secret://a/b",
        "crm://a",
        "x/y",
        "demob",
        "demo://a//b",
        "demo://",
        "x",
        "SECRET://a/b",
        "Demo://A/b",
        "DEMO://a",
    ];
    const MIMES: &[&str] = &["text/plain", "image/png", "application/pdf"];

    /// The glob definition, written the slow obvious way.
    fn glob_ref(p: &[char], s: &[char]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some('*') => {
                let run = p.iter().take_while(|c| **c == '*').count();
                let rest = &p[run..];
                (0..=s.len()).take_while(|&i| run >= 2 || i == 0 || s[i - 1] != '/').any(|i| glob_ref(rest, &s[i..]))
            }
            Some('?') => !s.is_empty() && s[0] != '/' && glob_ref(&p[1..], &s[1..]),
            Some('[') => {
                let end = p.iter().position(|c| *c == ']').unwrap();
                let (neg, set) = match p[1] {
                    '!' => (true, &p[2..end]),
                    _ => (false, &p[1..end]),
                };
                !s.is_empty() && s[0] != '/' && set.contains(&s[0]) != neg && glob_ref(&p[end + 1..], &s[1..])
            }
            Some(c) => s.first() == Some(c) && glob_ref(&p[1..], &s[1..]),
        }
    }

    type TestRule = (Option<&'static str>, Option<&'static str>, Option<&'static str>);

    fn rule_ref_matches((server, uri, mime): &TestRule, r: &Resource) -> bool {
        let g = |p: &str, s: &str| glob_ref(&p.chars().collect::<Vec<_>>(), &s.chars().collect::<Vec<_>>());
        g(server.unwrap_or("*"), &r.id.server)
            // Globs match canonical URIs: scheme and host case-insensitively.
            && g(&canonical_glob(uri.unwrap_or("**")), &canonical_uri(&r.id.uri))
            && mime.is_none_or(|m| r.mime_type.as_deref().is_some_and(|t| g(m, t)))
    }

    fn rule_yaml((server, uri, mime): &TestRule) -> String {
        let fields: Vec<String> = [("server", server), ("uri", uri), ("mime", mime)]
            .iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}: {}", json_quote(v))))
            .collect();
        format!("{{ {} }}", fields.join(", "))
    }

    fn test_rule() -> impl Strategy<Value = TestRule> {
        (
            proptest::option::of(proptest::sample::select(SERVER_GLOBS)),
            proptest::option::of(proptest::sample::select(URI_GLOBS)),
            proptest::option::weighted(0.3, proptest::sample::select(MIME_GLOBS)),
        )
    }

    fn rules() -> impl Strategy<Value = Vec<TestRule>> {
        proptest::collection::vec(test_rule(), 0..3)
    }

    proptest! {
        #[test]
        fn decide_agrees_with_the_definition(
            roles in proptest::collection::vec((rules(), rules()), 1..4),
            member_of in proptest::collection::vec(0usize..3, 0..3),
            own in (rules(), rules()),
            resources in proptest::collection::vec(
                (proptest::sample::select(SERVERS), proptest::sample::select(URIS),
                 proptest::option::of(proptest::sample::select(MIMES))),
                1..8,
            ),
        ) {
            let member_of: Vec<usize> = member_of.into_iter().filter(|&i| i < roles.len()).collect();
            let mut yaml = String::from("roles:\n");
            for (i, (allow, deny)) in roles.iter().enumerate() {
                yaml += &format!("  r{i}:\n    allow:\n");
                for r in allow { yaml += &format!("      - {}\n", rule_yaml(r)); }
                yaml += "    deny:\n";
                for r in deny { yaml += &format!("      - {}\n", rule_yaml(r)); }
            }
            let names: Vec<String> = member_of.iter().map(|i| format!("r{i}")).collect();
            yaml += &format!("users:\n  u:\n    roles: [{}]\n    allow:\n", names.join(", "));
            for r in &own.0 { yaml += &format!("      - {}\n", rule_yaml(r)); }
            yaml += "    deny:\n";
            for r in &own.1 { yaml += &format!("      - {}\n", rule_yaml(r)); }
            let policy = Policy::from_yaml(&yaml, Path::new("p.yaml")).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
            let user = policy.for_user("u");

            // (owner, rules) in the order decide looks at them.
            let mut seen = Vec::new();
            let mut owners = vec![("user u".to_owned(), &own)];
            for &i in &member_of {
                if !seen.contains(&i) { seen.push(i); owners.push((format!("role r{i}"), &roles[i])); }
            }
            for (server, uri, mime) in resources {
                let mut r = res(&format!("{server}:{uri}"));
                r.mime_type = mime.map(str::to_owned);
                let first = |effect: Effect| owners.iter().find_map(|(owner, (allow, deny))| {
                    let list = if effect == Effect::Allow { allow } else { deny };
                    list.iter().position(|t| rule_ref_matches(t, &r)).map(|i| (owner.clone(), effect, i))
                });
                let expected = first(Effect::Deny).or_else(|| first(Effect::Allow));
                let allowed = matches!(expected, Some((_, Effect::Allow, _)));
                let d = user.decide(&r);
                prop_assert_eq!(d.allowed, allowed, "{:?}\n{}", r.id, yaml);
                prop_assert_eq!(d.rule.map(|x| (x.owner, x.effect, x.index)), expected);
            }
        }
    }
}
