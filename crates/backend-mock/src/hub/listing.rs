//! The tree API's listing: a commit's entries under a directory (files with their LFS
//! details, the directories on the way), and the page of them one request gets, with the
//! `Link` to the next page as the Hub paginates.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::Shared;
use super::repo::{File, State, lfs_pointer, sha256_hex};
use super::wire::{Request, Response};
use crate::http::query_param;

/// One page of a tree listing: `tree_page` entries from the request's `cursor` (the first
/// page without one), and a `Link: <URL>; rel="next"` to the next page (the same request with
/// its `cursor`) while there are more, as the Hub paginates a long listing.
pub(super) fn tree_page(
    shared: &Shared,
    state: &State,
    request: &Request,
    entries: Vec<Value>,
) -> Response {
    let query = request.query.as_deref().unwrap_or("");
    let start: usize = match query_param(query, "cursor") {
        None => 0,
        Some(cursor) => match cursor.strip_prefix("page-").and_then(|n| n.parse().ok()) {
            Some(start) => start,
            None => return Response::hub_error(400, "BadRequest", "Invalid cursor"),
        },
    };
    let page = state.tree_page.max(1);
    let end = entries.len().min(start.saturating_add(page));
    let shown: Vec<Value> = entries
        .get(start..end)
        .map(<[Value]>::to_vec)
        .unwrap_or_default();
    let response = Response::json(200, &Value::Array(shown));
    if end >= entries.len() {
        return response;
    }
    let mut pairs: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("cursor="))
        .collect();
    let cursor = format!("cursor=page-{end}");
    pairs.push(&cursor);
    let next = format!("http://{}{}?{}", shared.hub, request.path, pairs.join("&"));
    response.header("Link", format!("<{next}>; rel=\"next\""))
}

/// The tree API's entries under `dir` ("" for the root), sorted by path; `None` if `dir` is
/// not a directory of the commit.
pub(super) fn tree_listing(
    files: &BTreeMap<String, Arc<File>>,
    dir: &str,
    recursive: bool,
) -> Option<Vec<Value>> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    let mut entries: BTreeMap<String, Value> = BTreeMap::new();
    let mut any = false;
    for (path, file) in files.range(prefix.clone()..) {
        let Some(rel) = path.strip_prefix(&prefix) else {
            break;
        };
        any = true;
        // Each directory on the way to the file.
        for (at, _) in rel.match_indices('/') {
            let first = !rel[..at].contains('/');
            if recursive || first {
                let dir_path = format!("{prefix}{}", &rel[..at]);
                let oid = sha256_hex(format!("tree {dir_path}").as_bytes())[..40].to_owned();
                entries.entry(dir_path.clone()).or_insert_with(
                    || json!({ "type": "directory", "oid": oid, "size": 0, "path": dir_path }),
                );
            }
        }
        if recursive || !rel.contains('/') {
            let mut entry = json!({
                "type": "file",
                "oid": file.git_oid,
                "size": file.len(),
                "path": path,
            });
            if file.lfs {
                let pointer = lfs_pointer(&file.sha256, file.len());
                entry["lfs"] = json!({
                    "oid": file.sha256,
                    "size": file.len(),
                    "pointerSize": pointer.len(),
                });
            }
            entries.insert(path.clone(), entry);
        }
    }
    (any || dir.is_empty()).then(|| entries.into_values().collect())
}
