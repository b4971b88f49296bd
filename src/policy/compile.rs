//! Loading a policy set: reading the files, parsing each into its raw form,
//! merging them (a role or user is defined in one file only), checking
//! every reference (roles named by users and `default_roles` exist), and
//! compiling the rules into their [`RuleSet`]s.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::glob::Pattern;
use super::matching::{FIELDS, Grant, Index, Rule, RuleSet, UserEntry};
use super::raw::{Include, MaxTokens, RawFile, RawRule};
use super::{Effect, Policy, RuleRef};
use crate::error::{Error, Result};
use crate::yaml::{self, Lenient, Node, Pos, Problems};

/// A load error for `path`, located when `at` is known.
pub(super) fn policy_error(path: &Path, at: Option<(usize, usize)>, message: String) -> Error {
    Error::Policy {
        path: path.to_path_buf(),
        line: at.map(|a| a.0),
        column: at.map(|a| a.1),
        message,
        more: Vec::new(),
    }
}

/// Every problem found in a policy set, in file order and then by position.
#[derive(Default)]
pub(super) struct Found(Vec<(usize, Option<Pos>, String)>);

impl Found {
    pub(super) fn add(&mut self, file: usize, pos: Option<Pos>, message: String) {
        self.0.push((file, pos, message));
    }

    /// One error: the first problem, with the others in `more`.
    fn into_error(mut self, files: &[(PathBuf, String)]) -> Option<Error> {
        self.0.sort_by_key(|(file, pos, _)| (*file, pos.map(|p| (p.line, p.column))));
        self.0.dedup();
        let mut errors = self
            .0
            .into_iter()
            .map(|(file, pos, message)| policy_error(&files[file].0, pos.map(|p| (p.line, p.column)), message));
        let mut first = errors.next()?;
        if let Error::Policy { more, .. } = &mut first {
            more.extend(errors);
        }
        Some(first)
    }
}

/// The position of a role's or user's definition (its key).
fn key_pos(root: &Node, section: &str, name: &str, nth: usize) -> Option<Pos> {
    root.get(section).and_then(|s| s.key_at(name, nth)).map(|k| k.pos)
}

/// Parses one file into its tree and raw form, recording every problem;
/// `None` when the text is not YAML at all.
fn parse_file<'a>(file: usize, src: &'a str, found: &mut Found) -> Option<(Node<'a>, RawFile)> {
    let root = match yaml::parse(src) {
        Ok(root) => root.unwrap_or_else(Node::empty_map),
        Err(mut e) => {
            if e.message.contains("anchor") || e.message.contains("alias") {
                e.message.push_str(" (a glob starting with `*` must be quoted: server: \"*\")");
            }
            found.add(file, e.pos, e.message);
            return None;
        }
    };
    let problems = Problems::default();
    let raw = yaml::from_node::<RawFile>(&root, &problems);
    let mut problems = problems.into_vec();
    if let Err(e) = &raw
        && problems.is_empty()
    {
        problems.push(e.clone());
    }
    for p in problems {
        found.add(file, p.pos, p.message);
    }
    Some((root, raw.unwrap_or_default()))
}

/// Merges and compiles files already read: `(path, text)` in merge order.
/// Every problem is collected; any makes the load fail, with all of them.
pub(super) fn build(files: &[(PathBuf, String)]) -> Result<Policy> {
    let mut found = Found::default();
    let mut default_roles: Option<(Vec<String>, usize)> = None;
    let mut roles: BTreeMap<String, (Arc<Grant>, usize)> = BTreeMap::new();
    let mut users: BTreeMap<String, (UserEntry, usize)> = BTreeMap::new();
    // Role names are only checked when every `roles:` section could be read.
    let mut roles_complete = true;
    let mut servers = Index::default();
    let mut names: HashSet<Arc<str>, ahash::RandomState> = HashSet::default();
    for (i, (path, text)) in files.iter().enumerate() {
        let Some((root, raw)) = parse_file(i, text, &mut found) else {
            roles_complete = false;
            continue;
        };
        if let Some(new) = raw.default_roles {
            match &default_roles {
                Some((old, j)) if *old != new => {
                    let msg = format!(
                        "default_roles is [{}] here but [{}] in {}; set it in one file only",
                        new.join(", "),
                        old.join(", "),
                        files[*j].0.display()
                    );
                    found.add(i, root.key_at("default_roles", 0).map(|k| k.pos), msg);
                }
                Some(_) => {}
                None => default_roles = Some((new, i)),
            }
        }
        roles_complete &= raw.roles.0.is_some() || root.get("roles").is_none();
        // What compiling needs of the tree (where each definition's rules
        // are), taken first so that the tree is gone before the rules are
        // compiled: the two together were the peak of a large policy's load.
        let mut todo = Vec::new();
        for (name, role) in raw.roles.0.unwrap_or_default().0 {
            if let Some((_, j)) = roles.get(&name) {
                let msg = format!(
                    "role `{name}` is already defined in {}; define each role in one file only",
                    files[*j].0.display()
                );
                found.add(i, key_pos(&root, "roles", &name, 0), msg);
                continue;
            }
            // A role that could not be read is still defined (its problems are recorded).
            let r = role.0.flatten().unwrap_or_default();
            let lines = Lines::of(root.at(&["roles", &name]));
            todo.push(("roles", name, (r.allow, r.deny, r.max_tokens, r.include, Vec::new()), lines));
        }
        for (name, user) in raw.users.0.unwrap_or_default().0 {
            if let Some((_, j)) = users.get(&name) {
                let msg = format!(
                    "user `{name}` is already defined in {}; define each user in one file only",
                    files[*j].0.display()
                );
                found.add(i, key_pos(&root, "users", &name, 0), msg);
                continue;
            }
            if let Some(problem) = crate::id::user_name_problem(&name) {
                found.add(i, key_pos(&root, "users", &name, 0), format!("user `{}`: {problem}", name.escape_debug()));
                continue;
            }
            let u = user.0.flatten().unwrap_or_default();
            let lines = Lines::of(root.at(&["users", &name]));
            todo.push(("users", name, (u.allow, u.deny, u.max_tokens, u.include, u.roles), lines));
        }
        drop(root);
        for (section, name, (allow, deny, max, include, member_of), lines) in todo {
            let owner = Owner { path, file: i, section, name: &name, lines };
            let grant = Arc::new(owner.grant(allow, deny, max, include, &mut servers, &mut found));
            if section == "roles" {
                roles.insert(name, (grant, i));
            } else {
                let member_of = dedup(member_of).into_iter().map(|r| intern(&mut names, r)).collect();
                users.insert(name, (UserEntry { roles: member_of, own: grant }, i));
            }
        }
    }

    // Every role referenced must exist: a typo must not silently grant nothing
    // (or, worse, be "fixed" later by someone defining a role of that name).
    let defined = || roles.keys().cloned().collect::<Vec<_>>().join(", ");
    // (file, path of the list, missing name, message), located below.
    let mut missing_roles: Vec<(usize, Vec<&str>, &str, String)> = Vec::new();
    // Hashed: a hundred thousand role references in an organisation's policy.
    let known: HashSet<&str, ahash::RandomState> = roles.keys().map(String::as_str).collect();
    if roles_complete {
        for (name, (entry, i)) in &users {
            for missing in entry.roles.iter().map(|r| &**r).filter(|r| !known.contains(*r)) {
                let msg = format!(
                    "user `{name}` has role `{missing}`, which no policy file defines (defined: {}); \
                     define it under `roles:` or fix the name",
                    defined()
                );
                missing_roles.push((*i, vec!["users", name, "roles"], missing, msg));
            }
        }
    }
    let (default_roles, i) = default_roles.unwrap_or_default();
    if roles_complete {
        for missing in default_roles.iter().filter(|r| !known.contains(r.as_str())) {
            let msg = format!(
                "default_roles names `{missing}`, which no policy file defines (defined: {}); \
                 define it under `roles:` or fix the name",
                defined()
            );
            missing_roles.push((i, vec!["default_roles"], missing, msg));
        }
    }
    // Only now, and only for files with such a problem, is a tree parsed again.
    let mut trees: BTreeMap<usize, Option<Node<'_>>> = BTreeMap::new();
    for (i, path, value, msg) in missing_roles {
        let root = trees.entry(i).or_insert_with(|| yaml::parse(&files[i].1).ok().flatten());
        let list = root.as_ref().and_then(|root| root.at(&path));
        let pos = list.and_then(|l| l.items().iter().find(|n| n.as_str() == Some(value)).or(Some(l))).map(|n| n.pos);
        found.add(i, pos, msg);
    }
    if let Err(e) = servers.finish() {
        found.add(0, None, e);
    }
    if let Some(e) = found.into_error(files) {
        return Err(e);
    }
    Ok(Policy {
        files: files.iter().map(|(p, _)| p.clone()).collect(),
        default_roles: dedup(default_roles),
        roles: roles.into_iter().map(|(k, (g, _))| (k, g)).collect(),
        users: users.into_iter().map(|(k, (u, _))| (k, u)).collect(),
        servers: Arc::new(servers),
    })
}

/// `v` without repeats, first occurrences kept in order (nothing cloned:
/// with thousands of users of fifty roles each, copies were a peak of their own).
pub(super) fn dedup<T: Eq + std::hash::Hash>(v: Vec<T>) -> Vec<T> {
    let keep: Vec<bool> = {
        let mut seen = HashSet::with_capacity_and_hasher(v.len(), ahash::RandomState::new());
        v.iter().map(|x| seen.insert(x)).collect()
    };
    v.into_iter().zip(keep).filter_map(|(x, keep)| keep.then_some(x)).collect()
}

/// The one shared copy of a role name.
fn intern(names: &mut HashSet<Arc<str>, ahash::RandomState>, name: String) -> Arc<str> {
    if let Some(n) = names.get(name.as_str()) {
        return Arc::clone(n);
    }
    let n: Arc<str> = name.into();
    names.insert(Arc::clone(&n));
    n
}

/// A role or user being compiled, with what is needed to locate its rules.
pub(super) struct Owner<'a> {
    pub(super) path: &'a Path,
    /// Its file's number, for problems.
    pub(super) file: usize,
    pub(super) section: &'a str,
    pub(super) name: &'a str,
    /// Where its rules are in the file.
    pub(super) lines: Lines,
}

/// Where a definition's rules are, per [`Effect`] (allow, deny): the line
/// of each rule, and the position of the `allow:` / `deny:` key.
#[derive(Default)]
pub(super) struct Lines {
    rules: [Vec<u32>; 2],
    keys: [Option<Pos>; 2],
}

impl Lines {
    fn of(body: Option<&Node<'_>>) -> Lines {
        let mut lines = Lines::default();
        for (k, key) in ["allow", "deny"].into_iter().enumerate() {
            let list = body.and_then(|b| b.get(key));
            lines.keys[k] = body.and_then(|b| b.key_at(key, 0)).map(|n| n.pos);
            // A rule not found (not a list item) gets the line of the list.
            lines.rules[k] = match list {
                Some(l) if !l.items().is_empty() => l.items().iter().map(|n| n.pos.line as u32).collect(),
                Some(l) => vec![l.pos.line as u32],
                None => Vec::new(),
            };
        }
        lines
    }

    fn line(&self, effect: Effect, index: usize) -> Option<usize> {
        let rules = &self.rules[effect as usize];
        rules.get(index).or(rules.last()).map(|&l| l as usize)
    }
}

impl Owner<'_> {
    /// Compiles what could be read; the parts that could not were recorded
    /// as problems already, and the load fails.
    pub(super) fn grant(
        &self,
        allow: Vec<Lenient<RawRule>>,
        deny: Vec<Lenient<RawRule>>,
        max: Option<Lenient<MaxTokens>>,
        include: Vec<Lenient<Include>>,
        servers: &mut Index,
        found: &mut Found,
    ) -> Grant {
        Grant {
            allow: self.rules(allow, Effect::Allow, servers, found),
            deny: self.rules(deny, Effect::Deny, servers, found),
            max_tokens: max.and_then(|m| m.0).map(|m| m.0),
            includes: include.into_iter().filter_map(|i| i.0).collect(),
            ..Grant::default()
        }
    }

    fn rules(&self, raw: Vec<Lenient<RawRule>>, effect: Effect, servers: &mut Index, found: &mut Found) -> RuleSet {
        let key = effect.to_string();
        let owner = format!("{} {}", &self.section[..self.section.len() - 1], self.name);
        let mut rules = Vec::with_capacity(raw.len());
        for (index, r) in raw.into_iter().enumerate().filter_map(|(index, r)| Some((index, r.0?))) {
            let reference = RuleRef {
                file: self.path.to_path_buf(),
                line: self.lines.line(effect, index),
                owner: owner.clone(),
                effect,
                index,
                rule: canonical(&r),
            };
            let (uri, folded) = r.uri.map_or_else(|| (Pattern::any(), None), |u| (u.0, u.1));
            let rule = Rule {
                server: r.server.unwrap_or_else(Pattern::no_slash),
                uri,
                mime_params: r.mime.as_ref().is_some_and(|m| m.0.text.contains(';')),
                mime: r.mime.map(|m| m.0),
                shared: [0; FIELDS],
                folded: false,
                reference,
            };
            // A deny rule whose glob names an upper-case scheme or host also
            // matches as folded, right after itself (see `UserPolicy::decide`).
            let folded = match folded {
                Some(uri) if effect == Effect::Deny => Some(Rule {
                    server: rule.server.clone(),
                    uri,
                    mime: rule.mime.clone(),
                    mime_params: rule.mime_params,
                    shared: [0; FIELDS],
                    folded: true,
                    reference: rule.reference.clone(),
                }),
                _ => None,
            };
            rules.push(rule);
            rules.extend(folded);
        }
        RuleSet::new(rules, servers).unwrap_or_else(|e| {
            let at = self.lines.keys[effect as usize];
            found.add(self.file, at, format!("{owner} {key}: {e}"));
            RuleSet::default()
        })
    }
}

/// The rule as written: the fields given, in a fixed order, quoted (built
/// by hand: one per rule, it was 4% of a 10k-rule policy's load through
/// `format!` and `serde_json`).
pub(super) fn canonical(r: &RawRule) -> String {
    let fields =
        [("server", r.server.as_ref()), ("uri", r.uri.as_ref().map(|u| &u.0)), ("mime", r.mime.as_ref().map(|m| &m.0))];
    let mut out = String::with_capacity(64);
    out.push('{');
    for (k, p) in fields.into_iter().filter_map(|(k, v)| Some((k, v?))) {
        out.push_str(if out.len() == 1 { " " } else { ", " });
        out.push_str(k);
        out.push_str(": ");
        push_json_quoted(&mut out, &p.text);
    }
    out.push_str(if out.len() == 1 { "}" } else { " }" });
    out
}

/// `s` as a JSON string, appended to `out`.
fn push_json_quoted(out: &mut String, s: &str) {
    // serde_json escapes only `"`, `\` and control characters: without
    // them the quoted form is the text between quotes.
    if s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        out.push_str(&json_quote(s));
    } else {
        out.push('"');
        out.push_str(s);
        out.push('"');
    }
}

pub(super) fn json_quote(s: &str) -> String {
    // Serializing a &str to JSON cannot fail; fall back to Debug just in case.
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}
