//! The pure selection step: the candidates (listings, the user's policy
//! includes through the gate, or the requested ids), the policy's decision
//! on each, the audience rule, and the injection order. Nothing is read.

use std::sync::Arc;

use crate::compose::DEFAULT_PRIORITY;
use crate::gate::{Refusal, admit};
use crate::hub::Hub;
use crate::id::ResourceId;
use crate::policy::UserPolicy;
use crate::report::{ExcludeReason, Excluded};
use crate::resource::Resource;

use super::views::UserViews;

/// Who may see what, for one user and one generation of the listings.
pub(super) struct Selection {
    /// In injection order.
    pub(super) resources: Vec<Arc<Resource>>,
    pub(super) excluded: Vec<Excluded>,
}

/// How a refused requested URI is reported: exactly like one that does not
/// exist, whatever the reason (the reason is for `policy explain` and tracing).
pub(super) fn not_found(id: &ResourceId) -> Excluded {
    Excluded { id: id.to_string(), reason: ExcludeReason::NotFound, detail: Some(Refusal::NOT_FOUND.into()) }
}

/// The hub that answers for `server`: the user's own view of it when it is
/// a per-user server they hold a credential for, else the shared hub.
pub(super) fn hub_for<'a>(hub: &'a Hub, own: &'a UserViews, server: &str) -> &'a Hub {
    own.view(server).map_or(hub, |v| &v.hub)
}

/// Every listed resource (the shared hub's, then the user's own views') plus
/// the user's policy includes that pass the gate, each against the listing
/// of the hub that serves it; the includes it refuses come back apart, for
/// the report.
pub(super) fn candidates(hub: &Hub, up: &UserPolicy, own: &UserViews) -> (Vec<Arc<Resource>>, Vec<Excluded>) {
    let mut all = hub.resources_shared();
    all.extend(own.resources());
    let mut refused = Vec::new();
    for inc in up.includes() {
        match admit(hub_for(hub, own, &inc.server), up, inc) {
            Ok(a) => {
                if !all.iter().any(|r| r.id == a.resource.id) {
                    all.push(a.resource);
                }
            }
            Err(why) => {
                tracing::warn!(user = up.user(), include = %inc, reason = %why, "policy include refused by the gate");
                refused.push(not_found(inc));
            }
        }
    }
    (all, refused)
}

/// The resources this user may see (or the `wanted` ones of them), in
/// injection order, and what was left out and why. `own` are the user's
/// own views of per-user servers (`views.rs`): their listings are
/// candidates like the hub's, under the same policy, and a wanted id or an
/// include on such a server passes the gate against the user's own listing
/// and templates.
pub(super) fn select(hub: &Hub, up: &UserPolicy, wanted: Option<&[ResourceId]>, own: &UserViews) -> Selection {
    let (candidates, mut excluded) = match wanted {
        None => candidates(hub, up, own),
        // Requested ids pass the gate: what is admitted is what the
        // policy decides on below and what is read.
        Some(sel) => {
            let (mut chosen, mut excluded) = (Vec::<Arc<Resource>>::new(), Vec::new());
            for id in sel {
                match admit(hub_for(hub, own, &id.server), up, id) {
                    Ok(a) if chosen.iter().any(|r| r.id == a.resource.id) => {}
                    Ok(a) => chosen.push(a.resource),
                    Err(Refusal::UnknownServer(server)) => excluded.push(Excluded {
                        id: id.to_string(),
                        reason: ExcludeReason::Error,
                        detail: Some(format!("unknown server `{server}`")),
                    }),
                    Err(why) => {
                        tracing::debug!(user = up.user(), requested = %id, reason = %why, "requested URI refused");
                        excluded.push(not_found(id));
                    }
                }
            }
            (chosen, excluded)
        }
    };
    let mut selected = Vec::new();
    for r in candidates {
        let d = up.decide(&r);
        if !d.allowed {
            excluded.push(Excluded { id: r.id.to_string(), reason: ExcludeReason::Denied, detail: Some(d.detail()) });
        } else if r.is_user_only() {
            excluded.push(Excluded {
                id: r.id.to_string(),
                reason: ExcludeReason::Audience,
                detail: Some("annotations.audience is [user]: meant for the human, not the model".into()),
            });
        } else {
            selected.push(r);
        }
    }
    let order = |r: &Arc<Resource>| hub.server_index(&r.id.server).unwrap_or(usize::MAX);
    selected.sort_by(|a, b| {
        let pa = a.annotations.priority.unwrap_or(DEFAULT_PRIORITY);
        let pb = b.annotations.priority.unwrap_or(DEFAULT_PRIORITY);
        pb.total_cmp(&pa).then(order(a).cmp(&order(b))).then_with(|| a.id.uri.cmp(&b.id.uri))
    });
    Selection { resources: selected, excluded }
}
