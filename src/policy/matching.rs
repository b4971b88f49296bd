//! The compiled form of a policy and how one resource is matched against it:
//! each grant's (role's or user's own) allow and deny rules in a [`RuleSet`]
//! indexed by literal server name, with the general `uri` globs in one
//! [`GlobsRegex`]; the policy-wide [`Index`] of server names and shared
//! `server`/`mime` globs; and the [`Subject`], a resource prepared once per
//! decision. See the parent module's "How decisions stay cheap".

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use globset::{Candidate, Glob, GlobSet, GlobSetBuilder};

use super::canonical_uri;
use super::glob::{Head, Matcher, Pattern, mime_essence, mime_with_params};
use super::raw::Include;
use super::{Effect, RuleRef};
use crate::id::ResourceId;
use crate::resource::Resource;

/// The rules and extras of one role, or of one user's own entry. Compiled
/// once at load and shared (`Arc`) by every user who has it.
#[derive(Debug)]
pub(super) struct Grant {
    /// Unique in the process: what [`DecisionKey`] identifies the grant by.
    pub(super) id: u64,
    pub(super) allow: RuleSet,
    pub(super) deny: RuleSet,
    pub(super) max_tokens: Option<usize>,
    pub(super) includes: Vec<Include>,
}

impl Default for Grant {
    fn default() -> Self {
        Grant {
            id: NEXT_GRANT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            allow: RuleSet::default(),
            deny: RuleSet::default(),
            max_tokens: None,
            includes: Vec::new(),
        }
    }
}

static NEXT_GRANT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Grant {
    pub(super) fn set(&self, effect: Effect) -> &RuleSet {
        match effect {
            Effect::Allow => &self.allow,
            Effect::Deny => &self.deny,
        }
    }

    #[cfg(test)]
    pub(super) fn rules(&self, effect: Effect) -> &[Rule] {
        &self.set(effect).rules
    }
}

/// What a user's decisions and includes depend on: the grants with rules,
/// in decision order, and the expanded includes. Users with equal keys see
/// exactly the same resources, decided by the same rules, so a selection
/// made for one serves them all.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct DecisionKey {
    pub(super) grants: Vec<u64>,
    pub(super) includes: Vec<ResourceId>,
}

#[derive(Debug)]
pub(super) struct UserEntry {
    /// Role names, shared between users (thousands of users name the same few hundred roles).
    pub(super) roles: Vec<Arc<str>>,
    pub(super) own: Arc<Grant>,
}

#[derive(Debug)]
pub(super) struct Rule {
    pub(super) server: Pattern,
    pub(super) uri: Pattern,
    pub(super) mime: Option<Pattern>,
    /// The `mime` glob names parameters (`;`): match it against the whole
    /// MIME type rather than its type/subtype.
    pub(super) mime_params: bool,
    /// Per [`Field`]: the number of a general `server`/`mime` glob in [`Index`].
    pub(super) shared: [u32; FIELDS],
    /// The second entry of a `deny` rule whose `uri` glob changes when its
    /// scheme and host are lower-cased: that folded glob, same reference.
    pub(super) folded: bool,
    pub(super) reference: RuleRef,
}

/// One kind (allow or deny) of one grant's rules, indexed so that a
/// resource is only tested against rules that can apply to it:
///
/// * rules whose `server` is a literal are found by the resource's server
///   (interned policy-wide, see [`Index`]), the others are always
///   candidates;
/// * the candidates are tried in file order, so the first match is the
///   rule that decides; a field whose glob has a literal shape (`x`,
///   `x*y`, `x**y`) is tested directly, the other `uri` globs are
///   compiled into one [`GlobsRegex`] per rule set, run at most once per
///   resource and only when a candidate needs it; its match indices map
///   back to rules through `rule_of`.
#[derive(Debug, Default)]
pub(super) struct RuleSet {
    /// In file order, a deny rule's folded entry right after it.
    pub(super) rules: Vec<Rule>,
    /// `(server id, rule)` for rules whose `server` is a literal, sorted.
    pub(super) by_server: Vec<(u32, u32)>,
    /// Rules whose `server` is a glob, ascending.
    pub(super) glob_server: Vec<u32>,
    /// Per [`Field`]: the rules' general globs in one set.
    pub(super) sets: [Option<FieldSet>; FIELDS],
}

/// A field's general globs, compiled together.
#[derive(Debug)]
pub(super) struct FieldSet {
    pub(super) set: GlobsRegex,
    /// The rule each glob of `set` belongs to (a pattern may be several globs).
    pub(super) rule_of: Vec<u32>,
}

/// Globs compiled together, matched whole against a string, reporting
/// every glob that matches.
///
/// A policy has one such set per rule set (hundreds or thousands). Each
/// `GlobSet` would keep its own regex search caches, allocated on its first
/// use and kept for the process's life (about 5 KiB each: 5 MiB more after
/// a few dozen users' decisions at 10k rules), and would compile one more
/// regex per glob for its extension strategy. So a rule set's globs are
/// globset's own regexes ([`Glob::regex`], compiled with globset's options)
/// in one multi-pattern regex, and they share [`CACHE_SLOTS`] search caches
/// per thread: regex `id` uses slot `id % CACHE_SLOTS`, replaced by a new
/// cache when another regex used the slot last. Memory no longer grows with the rule
/// sets decisions touch, and one user's rule sets (a hundred for 50 roles)
/// mostly keep their slots from one resource to the next, so a regex's
/// lazy DFA is rarely rebuilt.
pub(super) struct GlobsRegex {
    regex: regex_automata::meta::Regex,
    /// Unique in the process: which regex the thread's cache is set up for.
    id: u64,
}

static NEXT_REGEX_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Search caches per thread that [`GlobsRegex`]es share.
const CACHE_SLOTS: usize = 128;

thread_local! {
    /// The search caches [`GlobsRegex`]es share on this thread, each with
    /// the id of the regex it is set up for.
    static SEARCH_CACHES: std::cell::RefCell<Vec<Option<(u64, regex_automata::meta::Cache)>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl std::fmt::Debug for GlobsRegex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GlobsRegex({} globs)", self.regex.pattern_len())
    }
}

impl GlobsRegex {
    pub(super) fn build(globs: &[Glob]) -> std::result::Result<Self, String> {
        use regex_automata::{MatchKind, meta::Regex, util::syntax};
        let regexes: Vec<&str> = globs.iter().map(Glob::regex).collect();
        // The options `globset` builds its regex sets with (0.4.22, `new_regex_set`).
        let regex = Regex::builder()
            .syntax(syntax::Config::new().utf8(false).dot_matches_new_line(true))
            .configure(
                Regex::config()
                    .match_kind(MatchKind::All)
                    .utf8_empty(false)
                    .nfa_size_limit(Some(10 * (1 << 20)))
                    .hybrid_cache_capacity(10 * (1 << 20)),
            )
            .build_many(&regexes)
            .map_err(|e| e.to_string())?;
        let id = NEXT_REGEX_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(GlobsRegex { regex, id })
    }

    /// Indices of the globs matching `s`, ascending.
    pub(super) fn matches_into(&self, s: &str, out: &mut Vec<usize>) {
        use regex_automata::{Input, PatternSet};
        let mut set = PatternSet::new(self.regex.pattern_len());
        SEARCH_CACHES.with_borrow_mut(|slots| {
            if slots.is_empty() {
                slots.resize_with(CACHE_SLOTS, || None);
            }
            let slot = &mut slots[(self.id % CACHE_SLOTS as u64) as usize];
            // A fresh cache, not `Cache::reset`: regex-automata 0.4 panics
            // resetting a cache made for a regex of another search strategy.
            let cache = match slot {
                Some((id, cache)) if *id == self.id => cache,
                _ => &mut slot.insert((self.id, self.regex.create_cache())).1,
            };
            self.regex.which_overlapping_matches_with(cache, &Input::new(s.as_bytes()), &mut set);
        });
        out.extend(set.iter().map(|p| p.as_usize()));
    }
}

/// The fields a rule matches, each against its own string.
#[derive(Clone, Copy, Debug)]
pub(super) enum Field {
    Server = 0,
    Uri = 1,
    /// The MIME type's type/subtype.
    Mime = 2,
    /// The whole MIME type, parameters included.
    MimeParams = 3,
}

pub(super) const FIELDS: usize = 4;

/// What is compiled policy-wide: literal server names in rules, numbered
/// (a resource's server is looked up once per decision, not once per rule
/// set), and the general `server` and `mime` globs, which are few distinct
/// ones however many rules repeat them: each field's in one `GlobSet`, run
/// at most once per decision. (`uri` globs are many and mostly distinct:
/// they go in their rule set's own [`GlobsRegex`].)
#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) servers: HashMap<String, u32>,
    /// Per [`Field`] (the `Uri` slot stays empty).
    pub(super) shared: [SharedGlobs; FIELDS],
}

/// The distinct general globs of one field, policy-wide.
#[derive(Debug, Default)]
pub(super) struct SharedGlobs {
    /// Pattern (its globs, joined) to its number.
    pub(super) ids: HashMap<String, u32>,
    pub(super) builder: Option<GlobSetBuilder>,
    /// The pattern each glob of `set` belongs to.
    pub(super) pattern_of: Vec<u32>,
    pub(super) set: Option<GlobSet>,
}

impl Index {
    pub(super) fn intern(&mut self, name: &str) -> u32 {
        let next = self.servers.len() as u32;
        *self.servers.entry(name.to_owned()).or_insert(next)
    }

    pub(super) fn intern_globs(&mut self, field: Field, globs: &[Glob]) -> u32 {
        let shared = &mut self.shared[field as usize];
        let key: Vec<&str> = globs.iter().map(Glob::glob).collect();
        let next = shared.ids.len() as u32;
        let id = *shared.ids.entry(key.join("\0")).or_insert(next);
        if id == next {
            let builder = shared.builder.get_or_insert_with(GlobSetBuilder::new);
            for g in globs {
                builder.add(g.clone());
                shared.pattern_of.push(id);
            }
        }
        id
    }

    /// Compiles the shared sets; after the last rule set is built.
    pub(super) fn finish(&mut self) -> std::result::Result<(), String> {
        for shared in &mut self.shared {
            if let Some(b) = shared.builder.take() {
                shared.set =
                    Some(b.build().map_err(|e| format!("the policy's globs cannot be compiled together ({e})"))?);
            }
        }
        Ok(())
    }

    /// Numbers of the shared patterns of `field` that match `s`, ascending.
    pub(super) fn shared_matches(&self, field: Field, s: &str) -> Vec<u32> {
        let shared = &self.shared[field as usize];
        let Some(set) = &shared.set else { return Vec::new() };
        let mut globs = Vec::new();
        set.matches_candidate_into(&Candidate::from_bytes(s.as_bytes()), &mut globs);
        let mut ids: Vec<u32> = globs.into_iter().map(|g| shared.pattern_of[g]).collect();
        ids.dedup();
        ids
    }
}

impl RuleSet {
    pub(super) fn new(rules: Vec<Rule>, servers: &mut Index) -> std::result::Result<Self, String> {
        let mut set = RuleSet { rules, ..RuleSet::default() };
        let mut builders: [Option<(Vec<Glob>, Vec<u32>)>; FIELDS] = Default::default();
        for (i, rule) in set.rules.iter_mut().enumerate() {
            let i = i as u32;
            match &rule.server.matcher {
                Matcher::Literal(name, _) => set.by_server.push((servers.intern(name), i)),
                _ => set.glob_server.push(i),
            }
            let mime_field = if rule.mime_params { Field::MimeParams } else { Field::Mime };
            let mut shared = rule.shared;
            let fields = [(Field::Server, &mut rule.server), (Field::Uri, &mut rule.uri)]
                .into_iter()
                .chain(rule.mime.as_mut().map(|p| (mime_field, p)));
            for (field, pattern) in fields {
                if let Matcher::Globs(globs, _) = &mut pattern.matcher {
                    // Once in a set, a rule's globs are not needed again (only
                    // their `Needs`): moved, not cloned, they cost no memory twice.
                    let globs = std::mem::take(globs);
                    if !matches!(field, Field::Uri) {
                        shared[field as usize] = servers.intern_globs(field, &globs);
                        continue;
                    }
                    let (builder, rule_of) = builders[field as usize].get_or_insert_with(|| (Vec::new(), Vec::new()));
                    for g in globs.into_vec() {
                        builder.push(g);
                        rule_of.push(i);
                    }
                }
            }
            rule.shared = shared;
        }
        set.by_server.sort_unstable();
        for (slot, built) in set.sets.iter_mut().zip(builders) {
            if let Some((builder, rule_of)) = built {
                let globs = GlobsRegex::build(&builder).map_err(|e| {
                    format!("these rules are too many or too complex to compile together ({e}); split them over several roles")
                })?;
                *slot = Some(FieldSet { set: globs, rule_of });
            }
        }
        Ok(set)
    }

    /// The number of rules written.
    pub(super) fn len(&self) -> usize {
        self.rules.iter().filter(|r| !r.folded).count()
    }

    /// The first rule (in file order) matching `s`.
    pub(super) fn first_match(&self, s: &Subject<'_>) -> Option<&Rule> {
        let literal: &[(u32, u32)] = match s.server_id {
            Some(id) => {
                let from = self.by_server.partition_point(|p| p.0 < id);
                let len = self.by_server[from..].partition_point(|p| p.0 == id);
                &self.by_server[from..from + len]
            }
            None => &[],
        };
        if literal.is_empty() && self.glob_server.is_empty() {
            return None;
        }
        let mut hits = Hits::default();
        // Both lists ascend: merge them so rules are tried in file order.
        let (mut a, mut b) = (literal.iter().map(|p| p.1).peekable(), self.glob_server.iter().copied().peekable());
        loop {
            let i = match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x < y => a.next(),
                (Some(_), None) => a.next(),
                (_, Some(_)) => b.next(),
                (None, None) => return None,
            }?;
            let rule = &self.rules[i as usize];
            // A literal server was matched by the lookup above.
            let server = matches!(rule.server.matcher, Matcher::Literal(..))
                || self.field_matches(Field::Server, &rule.server, i, s.server, s, &mut hits);
            if server
                && self.field_matches(Field::Uri, &rule.uri, i, &s.uri, s, &mut hits)
                && match &rule.mime {
                    None => true,
                    Some(p) if rule.mime_params => s
                        .mime_params
                        .as_deref()
                        .is_some_and(|m| self.field_matches(Field::MimeParams, p, i, m, s, &mut hits)),
                    Some(p) => {
                        s.mime.as_deref().is_some_and(|m| self.field_matches(Field::Mime, p, i, m, s, &mut hits))
                    }
                }
            {
                return Some(rule);
            }
        }
    }

    pub(super) fn field_matches(
        &self,
        field: Field,
        p: &Pattern,
        rule: u32,
        s: &str,
        subject: &Subject<'_>,
        hits: &mut Hits,
    ) -> bool {
        match &p.matcher {
            Matcher::Globs(_, needs) if !needs.admits(s) => false,
            Matcher::Globs(..) if !matches!(field, Field::Uri) => {
                let id = self.rules[rule as usize].shared[field as usize];
                subject.shared[field as usize]
                    .get_or_init(|| subject.index.shared_matches(field, s))
                    .binary_search(&id)
                    .is_ok()
            }
            Matcher::Globs(..) => {
                let matched = hits.0[field as usize].get_or_insert_with(|| {
                    let Some(fs) = &self.sets[field as usize] else { return Vec::new() };
                    let mut globs = Vec::new();
                    fs.set.matches_into(s, &mut globs);
                    // Ascending glob indices give ascending rules (a rule's globs are contiguous).
                    let mut rules: Vec<u32> = globs.into_iter().map(|g| fs.rule_of[g]).collect();
                    rules.dedup();
                    rules
                });
                matched.binary_search(&rule).is_ok()
            }
            m => m.is_simple_match_at(s, subject.heads[field as usize]),
        }
    }
}

/// Which rules' general globs matched, per field, for one resource and one
/// rule set; filled on first need.
#[derive(Default)]
pub(super) struct Hits([Option<Vec<u32>>; FIELDS]);

/// A resource as rules see it, prepared once per decision.
pub(super) struct Subject<'a> {
    pub(super) index: &'a Index,
    /// Per [`Field`]: the shared patterns matching, once needed.
    pub(super) shared: [std::cell::OnceCell<Vec<u32>>; FIELDS],
    /// Per [`Field`]: the string's [`Head`].
    pub(super) heads: [[u64; 2]; FIELDS],
    pub(super) server: &'a str,
    /// `None`: no rule names this server literally.
    pub(super) server_id: Option<u32>,
    /// As the resource is named, or with scheme and host lower-cased
    /// (see [`Subject::folded`]).
    pub(super) uri: Cow<'a, str>,
    /// type/subtype, lower-case (see [`mime_essence`]).
    pub(super) mime: Option<Cow<'a, str>>,
    /// The whole type, normalised (see [`mime_with_params`]).
    pub(super) mime_params: Option<Cow<'a, str>>,
}

impl<'a> Subject<'a> {
    /// The resource as it is named: what every rule matches.
    pub(super) fn new(r: &'a Resource, index: &'a Index) -> Self {
        Self::with_uri(r, index, Cow::Borrowed(&r.id.uri))
    }

    /// The resource with its URI's scheme and host lower-cased, what `deny`
    /// rules also match; `None` when that changes nothing.
    pub(super) fn folded(r: &'a Resource, index: &'a Index) -> Option<Self> {
        match canonical_uri(&r.id.uri) {
            Cow::Borrowed(_) => None,
            folded => Some(Self::with_uri(r, index, folded)),
        }
    }

    fn with_uri(r: &'a Resource, index: &'a Index, uri: Cow<'a, str>) -> Self {
        let mime = r.mime_type.as_deref();
        let (mime, mime_params) = (mime.map(mime_essence), mime.map(mime_with_params));
        let head = |s: Option<&str>| s.map_or([0; 2], Head::of_subject);
        Subject {
            index,
            shared: Default::default(),
            heads: [
                Head::of_subject(&r.id.server),
                Head::of_subject(&uri),
                head(mime.as_deref()),
                head(mime_params.as_deref()),
            ],
            server: &r.id.server,
            server_id: index.servers.get(r.id.server.as_str()).copied(),
            uri,
            mime,
            mime_params,
        }
    }
}
