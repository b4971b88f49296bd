//! Finding the lines of YAML keys and list items, for errors and rule
//! references that serde cannot locate.

use std::collections::HashMap;

/// Finds the lines of keys and list items in block-style YAML text, for errors
/// and rule references that serde cannot locate (undefined roles, duplicate
/// definitions, rule positions). It understands the usual layout: nested
/// `key:` mappings by indentation, `- ` items (indented or not), and flow
/// lists/mappings on one line. Anything else (a policy written entirely in
/// flow style, keys split over lines) yields `None` or the nearest key line.
pub(super) struct Locator<'a> {
    /// Per line: indentation and content, or `None` for blank/comment lines.
    pub(super) lines: Vec<Option<(usize, &'a str)>>,
}

impl<'a> Locator<'a> {
    pub(super) fn new(text: &'a str) -> Self {
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
    pub(super) fn key(&self, path: &[&str]) -> Option<(usize, usize)> {
        self.position(*self.keys(path).first()?)
    }

    /// 1-based line and column of the content of the 0-based `line`.
    pub(super) fn position(&self, line: usize) -> Option<(usize, usize)> {
        self.lines.get(line).copied().flatten().map(|(indent, _)| (line + 1, indent + 1))
    }

    /// 0-based lines of every occurrence of the last key of `path`, following
    /// the first occurrence of each earlier key.
    pub(super) fn keys(&self, path: &[&str]) -> Vec<usize> {
        self.keys_in(0, self.lines.len(), path)
    }

    /// [`Locator::keys`] within the 0-based lines `from..to`.
    pub(super) fn keys_in(&self, mut from: usize, mut to: usize, path: &[&str]) -> Vec<usize> {
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

    /// The lines `from..to` (0-based) of the definition of each name under the
    /// top-level key `section`, as [`Locator::keys`] would find them for
    /// `[section, name, …]`, in one pass: locating each role's rules by
    /// rescanning the file made loading quadratic in the number of roles.
    pub(super) fn entries(&self, section: &str) -> HashMap<&'a str, (usize, usize)> {
        let mut out = HashMap::new();
        let all = self.lines.len();
        let Some(indent) = (0..all).find_map(|i| self.lines[i].map(|(ind, _)| ind)) else {
            return out;
        };
        let Some(line) = self.keys(&[section]).first().copied() else {
            return out;
        };
        let from = line + 1;
        let to = (from..all).find(|&i| matches!(self.lines[i], Some((ind, _)) if ind <= indent)).unwrap_or(all);
        let Some(child) = (from..to).find_map(|i| self.lines[i].map(|(ind, _)| ind)) else {
            return out;
        };
        // Lines that end a definition: every line at the names' indentation or less.
        let bounds: Vec<usize> =
            (from..to).filter(|&i| matches!(self.lines[i], Some((ind, _)) if ind <= child)).collect();
        for (k, &i) in bounds.iter().enumerate() {
            if let Some((ind, c)) = self.lines[i]
                && ind == child
                && let Some((name, _)) = mapping_key(c)
            {
                let end = bounds.get(k + 1).copied().unwrap_or(to);
                out.entry(name).or_insert((i + 1, end));
            }
        }
        out
    }

    /// 0-based lines of the `- ` items of the block list under `key_line`.
    pub(super) fn items(&self, key_line: usize) -> Vec<usize> {
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
    pub(super) fn value(&self, path: &[&str], value: &str) -> Option<(usize, usize)> {
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
pub(super) fn mapping_key(content: &str) -> Option<(&str, &str)> {
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
pub(super) fn find_word(s: &str, word: &str) -> Option<usize> {
    let is_name = |c: char| c.is_alphanumeric() || c == '-' || c == '_';
    s.match_indices(word).map(|(i, _)| i).find(|&i| {
        !s[..i].chars().next_back().is_some_and(is_name) && !s[i + word.len()..].chars().next().is_some_and(is_name)
    })
}

pub(super) fn unquote(s: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner;
        }
    }
    s
}
