//! Serving connections: a thread per connection on either socket, each request routed to the
//! Hub's routes or the CDN's, logged, and its answer written, until the server stops.

use std::io::{self, BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use super::cdn::route_cdn;
use super::routes::route_hub;
use super::wire::read_request;
use super::{CHUNK, HubLogged, Logged, Server, Shared, lock};

/// Accepts connections until the server stops, a thread each; then joins them.
pub(super) fn accept(listener: &TcpListener, server: Server, shared: &Arc<Shared>) {
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(stream) = stream else { continue };
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        {
            // Registered under the lock `drop` sweeps with, after checking the flag it sets
            // first: a connection is either shut down by `drop` or never served.
            let mut conns = lock(&shared.conns);
            if shared.stop.load(Ordering::Acquire) {
                break;
            }
            if let Ok(clone) = stream.try_clone() {
                conns.insert(id, clone);
            }
        }
        threads.retain(|t| !t.is_finished());
        let shared = Arc::clone(shared);
        threads.push(std::thread::spawn(move || {
            let _ = serve(stream, server, &shared);
            lock(&shared.conns).remove(&id);
        }));
    }
    for thread in threads {
        let _ = thread.join();
    }
}

fn serve(stream: TcpStream, server: Server, shared: &Shared) -> io::Result<()> {
    // Each answer's headers and small bodies go in one write: without TCP_NODELAY a response
    // split over several small writes waits on the client's delayed ACK.
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut out = BufWriter::with_capacity(CHUNK, stream);
    while let Some(request) = read_request(&mut reader)? {
        if shared.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let (response, seq) = {
            let mut state = shared.state();
            let response = match server {
                Server::Hub => route_hub(shared, &mut state, &request),
                Server::Cdn => route_cdn(shared, &mut state, &request),
            };
            let seq = state.next_seq;
            state.next_seq += 1;
            state.log.push(Logged {
                seq,
                entry: HubLogged {
                    server,
                    method: request.method.clone(),
                    path: request.path.clone(),
                    has_query: request.query.is_some(),
                    range: response.range.or(request.range),
                    status: response.status,
                    authorization: request.authorization.clone(),
                    sent: 0,
                },
            });
            (response, seq)
        };
        let keep = response.write(&mut out, request.method == "HEAD", shared, seq)?;
        if !keep || request.close {
            return Ok(());
        }
    }
    Ok(())
}
