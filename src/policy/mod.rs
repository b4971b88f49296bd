//! Access policy: which resources a user may see, their token budget, and
//! which resources to read for them even when no listing shows them.
//!
//! A policy is one YAML file or a folder of them (merged). It is loaded
//! strictly and fails closed: any doubt about what a file means is a load
//! error naming the file and line, never a silently wider or narrower policy.
//! Everything is compiled once at load; [`Policy::for_user`] only clones
//! `Arc`s, and [`UserPolicy::decide`] runs precompiled indexes and globs,
//! because it is called for every resource on every request.
//!
//! # Globs
//!
//! Rule fields (`server`, `uri`, `mime`) are globs matched case-sensitively
//! against the whole string (a resource's URI exactly as the server names
//! it: MCP URIs are opaque, `users://Bob` and `users://bob` are two). One
//! exception leans toward deny: a `deny` rule's `uri` also matches with the
//! scheme and host lower-cased in both glob and URI, so `deny: secret://**`
//! stops `SECRET://payroll` on a server that normalises. An `allow` rule
//! never does: `allow: acc://doc/**` does not grant `acc://DOC/upper`.
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
//! `mime` globs are matched against the type/subtype without parameters,
//! case-insensitively (MIME types are): `text/html` matches
//! `Text/HTML; profile=mcp-app`. A `mime` glob that names parameters
//! (`text/html;profile=mcp-app`) is matched against the whole type instead,
//! with type/subtype and parameter names lower-cased and blanks around `;`
//! and `=` removed, parameters in the order the server gives them.
//!
//! # How decisions stay cheap
//!
//! Organisation policies hold thousands of rules, and every resource of
//! every listing is decided for every user. So each role's (and each user's
//! own) allow rules and deny rules are compiled at load into a `RuleSet`:
//! rules whose `server` is a literal are indexed by server, so a resource is
//! tried only against rules that can apply to it; globs of a literal shape
//! (`x`, `x*y`, `x**y`, which most are) are tested directly, behind a check
//! of their first 16 bytes; the other `uri` globs of a rule set are compiled
//! into one multi-pattern regex (globset's own regexes; the rule sets share
//! a fixed number of search caches per thread, so memory does not grow with
//! the rule sets decisions touch), and the other `server` and `mime` globs
//! (few distinct ones, however many rules repeat them) into one `GlobSet`
//! each for the whole policy; a set runs at most once per resource, only when a
//! candidate's literal runs occur in the string. Candidates are tried in
//! file order and grants in decision order, and a set's match indices map
//! back to rules, so the deciding rule is the one the definition names.
//! Roles are compiled once and shared by every user; `McpContext` remembers
//! a selection per set of grants and listing generation.
//!
//! Matching uses `globset` with `literal_separator(true)`. globset gives `**`
//! gitignore semantics (`**/a` matches `a`, `a/**/b` matches `a/b`, `x**`
//! acts like `x*`), so each run of stars is rewritten before compiling: the
//! run matches either a run without `/` (`*`) or one with at least one `/`
//! (`*/**/*`, which globset compiles to `[^/]*(/|/.*/)[^/]*`). A pattern with
//! `k` runs thus becomes `2^k` globs, of which any may match; `k` is capped at
//! [`MAX_RECURSIVE_RUNS`].
//!
//! Layer: access. Imports only the bottom (`error`, `id`, `resource`, `yaml`); the gate imports it, never
//! the reverse.

//! # Where things are
//!
//! * this module: the public types ([`Policy`], [`UserPolicy`], [`Decision`],
//!   [`RuleRef`], the summaries) and [`UserPolicy::decide`];
//! * `matching`: the compiled form (rule sets, indexes, shared glob sets)
//!   and how one resource is matched against it;
//! * `glob`: the glob dialect and its rewrite to globset;
//! * `raw`: the file form, as serde reads it;
//! * `compile`: loading files, merging them, validating and compiling a
//!   policy set, collecting every problem;
//! * YAML errors and rule lines are located by `crate::yaml`, shared with
//!   the config: positions come from the YAML parser, whatever the layout.

mod canonical;
mod compile;
mod glob;
mod matching;
mod raw;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;

use crate::error::Result;
use crate::id::ResourceId;
use crate::resource::Resource;

pub(crate) use canonical::canonical_glob;
pub use canonical::canonical_uri;
use compile::{build, dedup, policy_error};
use glob::Pattern;
pub(crate) use matching::DecisionKey;
use matching::{FIELDS, Grant, Index, Rule, RuleSet, Subject, UserEntry};

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
    servers: Arc<Index>,
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
    servers: Arc<Index>,
    max_tokens: Option<usize>,
    includes: Vec<ResourceId>,
}

/// The outcome of [`UserPolicy::decide`] for one resource, with the rule that
/// settled it so reports can say *why*.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
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
#[non_exhaustive]
pub enum Effect {
    /// An `allow` rule.
    Allow,
    /// A `deny` rule; deny always wins over allow.
    Deny,
}

/// Where a rule came from, for explanations: `file:line: role staff deny[0] {…}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RuleRef {
    /// The policy file holding the rule.
    pub file: PathBuf,
    /// 1-based line of the rule (`None` for rules not read from a file).
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
#[non_exhaustive]
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
#[non_exhaustive]
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
#[non_exhaustive]
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
            mime_params: false,
            shared: [0; FIELDS],
            folded: false,
            reference: RuleRef {
                file: file.clone(),
                line: None,
                owner: "role all".into(),
                effect: Effect::Allow,
                index: 0,
                rule: r#"{ server: "*", uri: "**" }"#.into(),
            },
        };
        let mut servers = Index::default();
        // One rule with plain globs: nothing to compile, nothing can fail.
        let allow = RuleSet::new(vec![rule], &mut servers).unwrap_or_default();
        let grant = Grant { allow, ..Grant::default() };
        Policy {
            files: vec![file],
            default_roles: vec!["all".into()],
            roles: BTreeMap::from([("all".to_owned(), Arc::new(grant))]),
            users: BTreeMap::new(),
            servers: Arc::new(servers),
        }
    }

    /// The compiled view of one user: roles resolved, rules gathered,
    /// includes expanded. Users not listed get `default_roles`.
    pub fn for_user(&self, user: &str) -> UserPolicy {
        self.for_identity(user, &[])
    }

    /// What `user` may see with `extra_roles` from their identity provider
    /// (a verified token's mapped groups): the roles of their `users:` entry
    /// **plus** `extra_roles`, or `default_roles` when neither gives any.
    /// Role names this policy does not define are ignored (fail closed: they
    /// grant nothing). With no `extra_roles` this is [`Policy::for_user`].
    pub fn for_identity(&self, user: &str, extra_roles: &[String]) -> UserPolicy {
        let entry = self.users.get(user);
        let mut roles: Vec<String> = match entry {
            Some(u) => u.roles.iter().map(|r| r.to_string()).collect(),
            None if extra_roles.is_empty() => self.default_roles.clone(),
            None => Vec::new(),
        };
        for r in extra_roles {
            if self.roles.contains_key(r) && !roles.contains(r) {
                roles.push(r.clone());
            }
        }
        if roles.is_empty() && !extra_roles.is_empty() {
            roles = self.default_roles.clone();
        }
        let mut grants: Vec<Arc<Grant>> = entry.map(|u| Arc::clone(&u.own)).into_iter().collect();
        // Every role name was checked against `roles` at load, so none is dropped here.
        grants.extend(roles.iter().filter_map(|r: &String| self.roles.get(r).cloned()));
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
        let servers = Arc::clone(&self.servers);
        UserPolicy { user: user.to_owned(), roles, known: entry.is_some(), grants, servers, max_tokens, includes }
    }

    /// Whether the policy defines the role `name`.
    pub fn has_role(&self, name: &str) -> bool {
        self.roles.contains_key(name)
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
                .map(|(name, u)| UserSummary {
                    name: name.clone(),
                    roles: u.roles.iter().map(|r| r.to_string()).collect(),
                })
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
    /// no deny rule does. Allow rules match the URI exactly; deny rules also
    /// with its scheme and host lower-cased (see the module's "Globs"). A rule with `mime` only matches a resource whose
    /// *listing* gave a matching MIME type: we decide before reading, so a
    /// resource without a listed MIME type never matches such a rule (an
    /// allow-by-MIME does not let it in, a deny-by-MIME does not keep it out;
    /// use a `uri` rule where that matters).
    ///
    /// MIME rules match the type/subtype without parameters,
    /// case-insensitively (`text/html` matches `Text/HTML; profile=mcp-app`);
    /// a rule that names parameters (`text/html;profile=mcp-app`) is matched
    /// against the whole type instead.
    pub fn decide(&self, resource: &Resource) -> Decision {
        let subject = Subject::new(resource, &self.servers);
        let folded = Subject::folded(resource, &self.servers);
        // Grants in order (own, then roles), rules in file order: the first
        // match is the rule reported. A deny rule also matches with scheme
        // and host lower-cased on both sides (ambiguity resolves toward
        // deny); an allow rule only as written.
        let deny = self.grants.iter().find_map(|g| {
            let deny = g.set(Effect::Deny);
            let (exact, folded) = (deny.first_match(&subject), folded.as_ref().and_then(|f| deny.first_match(f)));
            exact.into_iter().chain(folded).min_by_key(|r| r.reference.index)
        });
        if let Some(rule) = deny {
            return Decision { allowed: false, rule: Some(rule.reference.clone()) };
        }
        match self.grants.iter().find_map(|g| g.set(Effect::Allow).first_match(&subject)) {
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

    /// What this user's decisions and includes depend on (see [`DecisionKey`]).
    pub(crate) fn decision_key(&self) -> DecisionKey {
        DecisionKey {
            grants: self.grants.iter().filter(|g| g.allow.len() + g.deny.len() > 0).map(|g| g.id).collect(),
            includes: self.includes.clone(),
        }
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

#[cfg(test)]
mod tests;
