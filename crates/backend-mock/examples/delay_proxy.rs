//! A TCP proxy that adds a round trip to every request, for the remote benchmark
//! (`benches/bench_remote.py --rtt-ms`): object stores are 10-50 ms away, loopback is not, and
//! this kernel has no `netem` qdisc to add the delay.
//!
//! ```text
//! cargo run --release -p backend-mock --example delay_proxy -- UPSTREAM_ADDR RTT_MS [LISTEN_ADDR]
//! ```
//! prints `http://ADDR` on stdout once listening, and proxies until killed.
//!
//! Each connection gets its own upstream connection. What the client sends is held back by the
//! whole round trip (each read forwarded `RTT_MS` after it arrived, in order, never later); what
//! the server answers is copied back at once. So a request's first byte of answer comes one round
//! trip later than without the proxy, while the bytes of a long body flow at loopback speed: the
//! latency of a distant store without its bandwidth limit (add `tbf` for that).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(upstream), Some(rtt)) = (args.next(), args.next()) else {
        return Err("usage: delay_proxy UPSTREAM_ADDR RTT_MS [LISTEN_ADDR]".into());
    };
    let rtt = Duration::from_secs_f64(rtt.parse::<f64>()? / 1000.0);
    let listener = TcpListener::bind(args.next().as_deref().unwrap_or("127.0.0.1:0"))?;
    let mut out = std::io::stdout();
    writeln!(out, "http://{}", listener.local_addr()?)?;
    out.flush()?;
    for client in listener.incoming() {
        let client = client?;
        let upstream = upstream.clone();
        std::thread::spawn(move || {
            if let Err(e) = proxy(client, &upstream, rtt) {
                eprintln!("delay_proxy: {e}");
            }
        });
    }
    Ok(())
}

/// Proxies one connection until either side closes it.
fn proxy(client: TcpStream, upstream: &str, rtt: Duration) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut from_client, mut to_server) = (client.try_clone()?, server.try_clone()?);
    let (mut from_server, mut to_client) = (server, client);

    // Client to server: each read stamped with when it is due, written when due.
    let (due, pending) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n @ 1..) = from_client.read(&mut buf) {
            if due.send((Instant::now() + rtt, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    let writer = std::thread::spawn(move || {
        for (when, bytes) in pending {
            std::thread::sleep(when.saturating_duration_since(Instant::now()));
            if to_server.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(Shutdown::Write);
    });

    // Server to client: at once, in large reads.
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match from_server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => to_client.write_all(&buf[..n])?,
        }
    }
    let _ = to_client.shutdown(Shutdown::Both);
    let _ = reader.join();
    let _ = writer.join();
    Ok(())
}
