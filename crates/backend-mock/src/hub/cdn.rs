//! The CDN's socket: a signed URL checked (signature, expiry), the LFS blob it names served
//! whole or by range, with the CDN's faults (a second hop, a first 503, a cut body) and S3's
//! error documents.

use super::repo::State;
use super::wire::{Request, Response};
use super::{Shared, unix_now};
use crate::http::query_param;

/// `HEAD` or `GET /repos/<sha256>?<signed query>` at the CDN.
pub(super) fn route_cdn(shared: &Shared, state: &mut State, request: &Request) -> Response {
    if request.method != "GET" && request.method != "HEAD" {
        return Response::s3_error(
            405,
            "MethodNotAllowed",
            "The specified method is not allowed",
        );
    }
    let query = request.query.as_deref().unwrap_or("");
    let number = |name| query_param(query, name).and_then(|e| e.parse::<u64>().ok());
    let signature = query_param(query, "X-Amz-Signature");
    let Some(expires) = number("Expires").filter(|&e| {
        number("X-Amz-Expires").is_some_and(|life| {
            signature.as_deref() == Some(shared.sign(&request.path, e, life).as_str())
        })
    }) else {
        return Response::s3_error(
            403,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        );
    };
    if unix_now() >= expires {
        return Response::s3_error(403, "AccessDenied", "Request has expired");
    }
    if let Some(host) = state.faults.cdn_hop.as_deref()
        && query_param(query, "hop").is_none()
    {
        let port = shared.cdn.port();
        return Response::new(302).header(
            "Location",
            format!("http://{host}:{port}{}?{query}&hop=1", request.path),
        );
    }
    let sha = request.path.strip_prefix("/repos/").unwrap_or("");
    if !state.blobs.contains_key(sha) {
        return Response::s3_error(404, "NoSuchKey", "The specified key does not exist.");
    }
    if request.method == "GET"
        && state.faults.fail_first
        && state.seen.insert((request.path.clone(), request.range))
    {
        return Response::s3_error(503, "SlowDown", "Please reduce your request rate.");
    }
    let Some(blob) = state.blobs.get(sha) else {
        return Response::s3_error(404, "NoSuchKey", "The specified key does not exist.");
    };
    let response = Response::file(&blob.content, request.range)
        .header("ETag", format!("\"{}\"", blob.etag))
        .header("Accept-Ranges", "bytes")
        .header("Content-Type", "application/octet-stream");
    if request.method == "GET" {
        let cut_once = state.faults.truncate_first
            && state
                .seen_cut
                .insert((request.path.clone(), request.range.map(|(_, end)| end)));
        let mut response = response.faulted(&state.faults, blob.paths.iter());
        response.cut |= cut_once;
        response
    } else {
        response
    }
}
