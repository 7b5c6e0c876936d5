//! Maps FILEs privately and makes every page usable, one way per MODE, then touches one byte of
//! every page; prints the seconds of the preparation and of the whole. Modes: `lazy` (nothing
//! before the touch: safetensors' way), `populate` (`MADV_POPULATE_READ` per chunk, on THREADS
//! threads), `willneed` (`MADV_WILLNEED` on each file, then populate), `fadvise`
//! (`POSIX_FADV_WILLNEED`, then populate), `pread` (our own reads of each chunk into a scratch
//! buffer, filling the page cache), `touchthreads` (THREADS threads touching chunks). Drop the
//! page cache before a cold run: `sync; echo 1 > /proc/sys/vm/drop_caches`.

#![allow(clippy::unwrap_used)] // an experiment: any failure ends it

use memmap2::{Advice, MmapOptions};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::time::Instant;

fn touch(m: &[u8]) -> u64 {
    let mut s = 0u64;
    let mut i = 0;
    while i < m.len() {
        // SAFETY: `i < m.len()`: a byte of the slice.
        s += unsafe { std::ptr::read_volatile(m.as_ptr().add(i)) } as u64;
        i += 4096;
    }
    s
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args[1].clone();
    let threads: usize = args[2].parse().unwrap();
    let chunk: usize = args[3].parse::<usize>().unwrap() << 20;
    let files: Vec<String> = args[4..].to_vec();
    let t0 = Instant::now();
    let maps: Vec<_> = files
        .iter()
        .map(|f| {
            let file = File::open(f).unwrap(); // SAFETY: nothing else writes these files while the experiment runs.
            let m = unsafe { MmapOptions::new().map_copy(&file).unwrap() };
            (file, m)
        })
        .collect();
    // work items: (map idx, off, len)
    let mut items = vec![];
    for (i, (_, m)) in maps.iter().enumerate() {
        let mut o = 0;
        while o < m.len() {
            let l = chunk.min(m.len() - o);
            items.push((i, o, l));
            o += l;
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    match mode.as_str() {
        "lazy" => {}
        "populate" | "willneed" | "pread" | "touchthreads" | "fadvise" => {
            if mode == "willneed" {
                for (_, m) in &maps {
                    m.advise(Advice::WillNeed).unwrap();
                }
            }
            if mode == "fadvise" {
                for (f, m) in &maps {
                    // SAFETY: an advice on an open descriptor.
                    unsafe {
                        libc::posix_fadvise(
                            f.as_raw_fd(),
                            0,
                            m.len() as i64,
                            libc::POSIX_FADV_WILLNEED,
                        );
                    }
                }
            }
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        let mut buf = vec![0u8; if mode == "pread" { chunk } else { 0 }];
                        loop {
                            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if k >= items.len() {
                                break;
                            }
                            let (i, o, l) = items[k];
                            match mode.as_str() {
                                "pread" => {
                                    maps[i].0.read_exact_at(&mut buf[..l], o as u64).unwrap();
                                }
                                "touchthreads" => {
                                    touch(&maps[i].1[o..o + l]);
                                }
                                _ => {
                                    maps[i].1.advise_range(Advice::PopulateRead, o, l).unwrap();
                                }
                            }
                        }
                    });
                }
            });
        }
        _ => panic!(),
    }
    let t1 = t0.elapsed().as_secs_f64();
    let mut s = 0;
    for (_, m) in &maps {
        s += touch(m);
    }
    let t2 = t0.elapsed().as_secs_f64();
    println!(
        "{mode} t={threads} c={} prep={t1:.3} total={t2:.3} {s}",
        chunk >> 20
    );
}
