//! Fills memory that is already resident (a model's weights) with the bytes of FILEs that are in
//! the page cache, one way per MODE, ROUNDS times in one process; prints each round's seconds.
//! Modes: `map` (a private mapping, copied in PIECE_MIB pieces, each unmapped again with
//! `MADV_DONTNEED` once copied: the reload path of 2026-12-03), `mapkeep` (the same, never
//! unmapped), `pread` (`pread` of each piece straight into the memory). THREADS threads take
//! pieces in file order from a shared counter.
//!   cargo run --release --manifest-path benches/map-experiment/Cargo.toml --bin copy -- \
//!     MODE THREADS PIECE_MIB ROUNDS FILE...

#![allow(clippy::unwrap_used)] // an experiment: any failure ends it

use memmap2::{Advice, MmapOptions};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

struct Dst(*mut u8);
// SAFETY: the threads write disjoint pieces of one buffer that outlives them.
unsafe impl Sync for Dst {}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args[1].clone();
    let threads: usize = args[2].parse().unwrap();
    let piece: usize = args[3].parse::<usize>().unwrap() << 20;
    let rounds: usize = args[4].parse().unwrap();
    let files: Vec<File> = args[5..].iter().map(|f| File::open(f).unwrap()).collect();
    let sizes: Vec<usize> = files.iter().map(|f| f.metadata().unwrap().len() as usize).collect();
    let total: usize = sizes.iter().sum();
    let mut dst = vec![1u8; total]; // resident
    for _ in 0..rounds {
        let t0 = Instant::now();
        // SAFETY: nothing writes these files while the experiment runs.
        let maps: Vec<_> = if mode == "pread" {
            vec![]
        } else {
            files.iter().map(|f| unsafe { MmapOptions::new().map_copy(f).unwrap() }).collect()
        };
        let mut items = vec![];
        let mut base = 0;
        for (i, &size) in sizes.iter().enumerate() {
            let mut o = 0;
            while o < size {
                let l = piece.min(size - o);
                items.push((i, o, l, base + o));
                o += l;
            }
            base += size;
        }
        let next = AtomicUsize::new(0);
        let out = Dst(dst.as_mut_ptr());
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let out = &out;
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(i, o, l, at)) = items.get(k) else { break };
                        // SAFETY: piece `k` of the buffer is written by this thread alone.
                        let d = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), l) };
                        if mode == "pread" {
                            files[i].read_exact_at(d, o as u64).unwrap();
                        } else {
                            d.copy_from_slice(&maps[i][o..o + l]);
                            if mode == "map" {
                                // SAFETY: the piece was copied and is read no more.
                                unsafe { maps[i].unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, o, l).unwrap() };
                            }
                        }
                    }
                });
            }
        });
        let _ = Advice::Normal;
        drop(maps);
        print!("{:.4} ", t0.elapsed().as_secs_f64());
    }
    println!("({mode}, {threads} threads, {} MiB pieces)", piece >> 20);
}
