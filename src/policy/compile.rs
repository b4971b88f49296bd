//! Loading a policy set: reading the files, parsing each into its raw form,
//! merging them (a role or user is defined in one file only), checking
//! every reference (roles named by users and `default_roles` exist), and
//! compiling the rules into their [`RuleSet`]s.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::glob::Pattern;
use super::locate::Locator;
use super::matching::{FIELDS, Grant, Index, Rule, RuleSet, UserEntry};
use super::raw::{Include, MaxTokens, RawFile, RawRule};
use super::{Effect, Policy, RuleRef};
use crate::error::{Error, Result};

pub(super) fn policy_error(path: &Path, at: Option<(usize, usize)>, message: String) -> Error {
    Error::Policy { path: path.to_path_buf(), line: at.map(|a| a.0), column: at.map(|a| a.1), message }
}

pub(super) fn parse_file(path: &Path, src: &str) -> Result<RawFile> {
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
pub(super) fn build(files: &[(PathBuf, String)]) -> Result<Policy> {
    let mut default_roles: Option<(Vec<String>, usize)> = None;
    let mut roles: BTreeMap<String, (Arc<Grant>, usize)> = BTreeMap::new();
    let mut users: BTreeMap<String, (UserEntry, usize)> = BTreeMap::new();
    let mut servers = Index::default();
    for (i, (path, text)) in files.iter().enumerate() {
        let raw = parse_file(path, text)?;
        let loc = Locator::new(text);
        let (role_entries, user_entries) = (loc.entries("roles"), loc.entries("users"));
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
            let body = role_entries.get(name.as_str()).copied();
            let owner = Owner { path, loc: &loc, section: "roles", name: &name, body };
            let grant = owner.grant(role.allow, role.deny, role.max_tokens, role.include, &mut servers)?;
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
            let body = user_entries.get(name.as_str()).copied();
            let owner = Owner { path, loc: &loc, section: "users", name: &name, body };
            let own = owner.grant(user.allow, user.deny, user.max_tokens, user.include, &mut servers)?;
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
    if let Err(e) = servers.finish() {
        return Err(policy_error(&files.first().map(|f| f.0.clone()).unwrap_or_default(), None, e));
    }
    Ok(Policy {
        files: files.iter().map(|(p, _)| p.clone()).collect(),
        default_roles: dedup(default_roles),
        roles: roles.into_iter().map(|(k, (g, _))| (k, g)).collect(),
        users: users.into_iter().map(|(k, (u, _))| (k, u)).collect(),
        servers: Arc::new(servers),
    })
}

/// `v` without repeats, first occurrences kept in order.
pub(super) fn dedup<T: Eq + std::hash::Hash + Clone>(v: Vec<T>) -> Vec<T> {
    let mut seen = HashSet::with_capacity(v.len());
    v.into_iter().filter(|x| seen.insert(x.clone())).collect()
}

/// A role or user being compiled, with what is needed to locate its rules.
pub(super) struct Owner<'a> {
    pub(super) path: &'a Path,
    pub(super) loc: &'a Locator<'a>,
    pub(super) section: &'a str,
    pub(super) name: &'a str,
    /// The lines of its definition (see [`Locator::entries`]).
    pub(super) body: Option<(usize, usize)>,
}

impl Owner<'_> {
    pub(super) fn grant(
        &self,
        allow: Vec<RawRule>,
        deny: Vec<RawRule>,
        max: Option<MaxTokens>,
        include: Vec<Include>,
        servers: &mut Index,
    ) -> Result<Grant> {
        Ok(Grant {
            allow: self.rules(allow, Effect::Allow, servers)?,
            deny: self.rules(deny, Effect::Deny, servers)?,
            max_tokens: max.map(|m| m.0),
            includes: include,
            ..Grant::default()
        })
    }

    pub(super) fn rules(&self, raw: Vec<RawRule>, effect: Effect, servers: &mut Index) -> Result<RuleSet> {
        let key = effect.to_string();
        // 0-based line of `allow:` / `deny:` in this owner's definition.
        let key_line = self.body.and_then(|(from, to)| self.loc.keys_in(from, to, &[&key]).first().copied());
        let items = key_line.map(|l| self.loc.items(l)).unwrap_or_default();
        let owner = format!("{} {}", &self.section[..self.section.len() - 1], self.name);
        let rules = raw
            .into_iter()
            .enumerate()
            .map(|(index, r)| {
                let reference = RuleRef {
                    file: self.path.to_path_buf(),
                    line: key_line.map(|l| items.get(index).copied().unwrap_or(l) + 1),
                    owner: owner.clone(),
                    effect,
                    index,
                    rule: canonical(&r),
                };
                Rule {
                    server: r.server.unwrap_or_else(Pattern::no_slash),
                    uri: r.uri.map_or_else(Pattern::any, |u| u.0),
                    mime_params: r.mime.as_ref().is_some_and(|m| m.0.text.contains(';')),
                    mime: r.mime.map(|m| m.0),
                    shared: [0; FIELDS],
                    reference,
                }
            })
            .collect();
        RuleSet::new(rules, servers).map_err(|e| {
            let at = key_line.and_then(|l| self.loc.position(l));
            policy_error(self.path, at, format!("{owner} {key}: {e}"))
        })
    }
}

/// The rule as written: the fields given, in a fixed order, quoted.
pub(super) fn canonical(r: &RawRule) -> String {
    let fields: Vec<String> =
        [("server", r.server.as_ref()), ("uri", r.uri.as_ref().map(|u| &u.0)), ("mime", r.mime.as_ref().map(|m| &m.0))]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|p| format!("{k}: {}", json_quote(&p.text))))
            .collect();
    if fields.is_empty() { "{}".into() } else { format!("{{ {} }}", fields.join(", ")) }
}

pub(super) fn json_quote(s: &str) -> String {
    // Serializing a &str to JSON cannot fail; fall back to Debug just in case.
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}
