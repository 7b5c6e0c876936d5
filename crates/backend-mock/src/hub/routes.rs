//! The Hub's socket: a request's path read as the Hub's API (`/api/models/{repo}[/revision|/tree]`)
//! or a `resolve` URL, with what comes before either (a mirror's prefix, a renamed repo, an
//! outage, a private or gated repo) and what `resolve` answers (a plain file, or a redirect to a
//! signed CDN URL for an LFS file).

use std::sync::Arc;

use serde_json::{Value, json};

use super::listing::{tree_listing, tree_page};
use super::repo::{Repo, State};
use super::wire::{Request, Response, decode_segment};
use super::{Shared, unix_now};
use crate::http::query_param;

/// Splits `segments` into a repo id (one or two segments), the endpoint word after it (one of
/// `kinds`) and the rest. Prefers a registered repo; else the two-segment reading.
fn split_repo<'a>(
    state: &State,
    segments: &'a [String],
    kinds: &[&str],
) -> Option<(String, &'a str, &'a [String])> {
    let mut found = None;
    for n in [2, 1] {
        if let Some(kind) = segments.get(n)
            && kinds.contains(&kind.as_str())
            && segments[..n].iter().all(|s| !s.is_empty())
        {
            let candidate = (segments[..n].join("/"), kind.as_str(), &segments[n + 1..]);
            if state.repos.contains_key(&candidate.0) {
                return Some(candidate);
            }
            found.get_or_insert(candidate);
        }
    }
    found
}

fn repo_not_found(status: u16) -> Response {
    Response::hub_error(status, "RepoNotFound", "Repository not found")
}

fn revision_not_found(rev: &str) -> Response {
    Response::hub_error(404, "RevisionNotFound", &format!("Invalid rev id: {rev}"))
}

pub(super) fn route_hub(shared: &Shared, state: &mut State, request: &Request) -> Response {
    if request.method != "GET" && request.method != "HEAD" {
        return Response::new(405);
    }
    if let Some(status) = state.faults.outage {
        let (code, message) = match status {
            429 => ("RateLimited", "You have been rate-limited"),
            _ => ("ServiceUnavailable", "The service is unavailable"),
        };
        return Response::hub_error(status, code, message);
    }
    let Some(path) = request.path.strip_prefix(state.prefix.as_str()) else {
        return Response::hub_error(404, "NotFound", "Not Found");
    };
    if !state.prefix.is_empty() && !path.is_empty() && !path.starts_with('/') {
        return Response::hub_error(404, "NotFound", "Not Found");
    }
    let segments: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(decode_segment)
        .collect();
    if let Some(moved) = renamed(state, &segments) {
        let query = request
            .query
            .as_ref()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        return Response::new(307).header("Location", format!("{}{moved}{query}", state.prefix));
    }
    if let Some(rest) = segments.strip_prefix(&["api".to_owned(), "models".to_owned()]) {
        return match split_repo(state, rest, &["revision", "tree"]) {
            Some((repo_id, "revision", [rev])) => api(shared, state, request, &repo_id, rev, None),
            Some((repo_id, "tree", [rev, path @ ..])) => {
                api(shared, state, request, &repo_id, rev, Some(&path.join("/")))
            }
            // `/api/models/{repo}`: the repo at `main`.
            None if (1..=2).contains(&rest.len()) => {
                api(shared, state, request, &rest.join("/"), "main", None)
            }
            _ => Response::hub_error(404, "NotFound", "Not Found"),
        };
    }
    match split_repo(state, &segments, &["resolve"]) {
        Some((repo_id, _, [rev, path @ ..])) if !path.is_empty() => {
            resolve(shared, state, request, &repo_id, rev, &path.join("/"))
        }
        _ => Response::hub_error(404, "NotFound", "Not Found"),
    }
}

/// The path `segments` (decoded) name under a repository's new name, if they name a renamed
/// one (`/api/models/{old}/...` or `/{old}/resolve/...`), encoded as the Hub writes a path.
fn renamed(state: &State, segments: &[String]) -> Option<String> {
    let (api, rest) = match segments {
        [a, m, rest @ ..] if a == "api" && m == "models" => (true, rest),
        rest => (false, rest),
    };
    for n in [2, 1] {
        let (Some(id), Some(tail)) = (rest.get(..n), rest.get(n..)) else {
            continue;
        };
        if let Some(new) = state.renamed.get(&id.join("/")) {
            let encode = |s: &String| crate::http::percent_encode_segment(s);
            let tail: Vec<String> = tail.iter().map(encode).collect();
            let head = if api { "/api/models/" } else { "/" };
            return Some(format!("{head}{new}/{}", tail.join("/")));
        }
    }
    None
}

/// The repo if it exists and the request may see it.
fn visible<'s>(state: &'s State, repo_id: &str, request: &Request) -> Result<&'s Repo, Response> {
    let repo = state
        .repos
        .get(repo_id)
        .ok_or_else(|| repo_not_found(404))?;
    if let Some(tokens) = state.private.get(repo_id)
        && !request
            .token()
            .is_some_and(|t| tokens.iter().any(|k| k == t))
    {
        return Err(repo_not_found(401));
    }
    Ok(repo)
}

/// The revision endpoint (`tree` None) or the tree endpoint (`tree` the directory, "" for the
/// root).
fn api(
    shared: &Shared,
    state: &State,
    request: &Request,
    repo_id: &str,
    rev: &str,
    tree: Option<&str>,
) -> Response {
    let repo = match visible(state, repo_id, request) {
        Ok(repo) => repo,
        Err(response) => return response,
    };
    let Some((commit, files)) = repo
        .commit_of(rev)
        .and_then(|c| repo.commits.get_key_value(c))
    else {
        return revision_not_found(rev);
    };
    let Some(dir) = tree else {
        let siblings: Vec<Value> = files.keys().map(|p| json!({ "rfilename": p })).collect();
        let gated = if state.gated.contains_key(repo_id) {
            json!("auto")
        } else {
            json!(false)
        };
        return Response::json(
            200,
            &json!({
                "id": repo_id,
                "modelId": repo_id,
                "sha": commit,
                "siblings": siblings,
                "private": state.private.contains_key(repo_id),
                "gated": gated,
            }),
        )
        .header("X-Repo-Commit", commit.clone());
    };
    let recursive = request
        .query
        .as_deref()
        .and_then(|q| query_param(q, "recursive"))
        .is_some_and(|v| v == "true" || v == "1");
    let dir = dir.trim_matches('/');
    match tree_listing(files, dir, recursive) {
        Some(entries) => tree_page(shared, state, request, entries),
        None => Response::hub_error(
            404,
            "EntryNotFound",
            &format!("{dir} does not exist on \"{rev}\""),
        )
        .header("X-Repo-Commit", commit.clone()),
    }
}

/// `HEAD` or `GET /{repo}/resolve/{rev}/{path}`.
fn resolve(
    shared: &Shared,
    state: &mut State,
    request: &Request,
    repo_id: &str,
    rev: &str,
    path: &str,
) -> Response {
    let repo = match visible(state, repo_id, request) {
        Ok(repo) => repo,
        Err(response) => return response,
    };
    if let Some(tokens) = state.gated.get(repo_id) {
        let restricted = match request.token() {
            None => Some((
                401,
                format!(
                    "Access to model {repo_id} is restricted. You must have access to it and \
                     be authenticated to access it. Please log in."
                ),
            )),
            Some(token) if !tokens.iter().any(|t| t == token) => Some((
                403,
                format!(
                    "Access to model {repo_id} is restricted and you are not in the authorized \
                     list. Visit https://huggingface.co/{repo_id} to ask for access."
                ),
            )),
            Some(_) => None,
        };
        if let Some((status, message)) = restricted {
            return Response::hub_error(status, "GatedRepo", &message);
        }
    }
    let Some((commit, files)) = repo
        .commit_of(rev)
        .and_then(|c| repo.commits.get_key_value(c))
    else {
        return revision_not_found(rev);
    };
    let (commit, files) = (commit.clone(), Arc::clone(files));
    let faults = &state.faults;
    let file = match files.get(path) {
        Some(file) if !faults.missing.contains(path) => file,
        _ => {
            return Response::hub_error(404, "EntryNotFound", "Entry not found")
                .header("X-Repo-Commit", commit);
        }
    };
    if faults.redirect_loop.contains(path) {
        return Response::new(302)
            .header(
                "Location",
                format!("http://{}{}", shared.hub, request.target),
            )
            .header("X-Repo-Commit", commit);
    }
    if !file.lfs {
        let paths = [path.to_owned()];
        return Response::file(&file.content, request.range)
            .faulted(faults, paths.iter())
            .header("ETag", format!("\"{}\"", file.git_oid))
            .header("X-Repo-Commit", commit)
            .header("Accept-Ranges", "bytes")
            .header("Content-Type", "application/octet-stream");
    }
    let expire_after = faults.expire_after;
    let now = unix_now();
    let first = state.issued.insert((repo_id.to_owned(), path.to_owned()));
    let expires = if state.faults.expire_once && first {
        now.saturating_sub(1)
    } else {
        now.saturating_add(expire_after)
    };
    let cdn_path = format!("/repos/{}", file.sha256);
    let signature = shared.sign(&cdn_path, expires, expire_after);
    Response::new(302)
        .header(
            "Location",
            format!(
                "http://{}{cdn_path}?X-Amz-Expires={expire_after}&Expires={expires}&X-Amz-Signature={signature}",
                shared.cdn
            ),
        )
        .header("X-Linked-Etag", format!("\"{}\"", file.sha256))
        .header("X-Linked-Size", file.len().to_string())
        .header("X-Repo-Commit", commit)
        .header("ETag", format!("\"{}\"", file.git_oid))
}
