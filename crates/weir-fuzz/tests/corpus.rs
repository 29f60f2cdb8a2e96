//! Every fuzz target over its corpus (`fuzz/corpus/NAME`, kept in the
//! repository: seeds from the tests and what campaigns found) and a few
//! thousand mutations of it from a fixed seed: the brief run CI makes on
//! stable, so a parser that regresses on an input the campaign reached
//! fails here. Long runs are `scripts/fuzz.sh` (libFuzzer, nightly).

use std::path::PathBuf;

use weir_fuzz::TARGETS;

/// Mutations of each corpus file per run (`WEIR_FUZZ_MUTATIONS` overrides).
const MUTATIONS: usize = 300;

fn corpus(name: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(name);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// xorshift64*: a fixed sequence, so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One of libFuzzer's simple mutations of `input` (`other`: another file
/// of the corpus, for splicing).
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 => out.insert(at, b"\r\n\t :;,=%/.\"\\\0"[rng.below(14)]),
            2 if at < out.len() => {
                out.remove(at);
            }
            3 => out.truncate(at),
            4 if !other.is_empty() => {
                let from = rng.below(other.len());
                let to = (from + rng.below(64)).min(other.len());
                out.splice(at..at, other[from..to].iter().copied());
            }
            5 if !out.is_empty() => {
                let from = rng.below(out.len());
                let to = (from + rng.below(16)).min(out.len());
                let copy = out[from..to].to_vec();
                out.splice(at..at, copy);
            }
            _ => out.insert(at, rng.next() as u8),
        }
    }
    out
}

#[test]
fn every_target_survives_its_corpus_and_mutations_of_it() {
    let mutations: usize = std::env::var("WEIR_FUZZ_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(MUTATIONS);
    for (name, target) in TARGETS {
        let files = corpus(name);
        assert!(!files.is_empty(), "{name}: an empty corpus");
        let mut rng = Rng(0x5EED ^ name.len() as u64);
        for (i, input) in files.iter().enumerate() {
            target(input);
            let other = &files[(i + 1) % files.len()];
            for _ in 0..mutations {
                let m = mutate(&mut rng, input, other);
                let run = std::panic::catch_unwind(|| target(&m));
                assert!(
                    run.is_ok(),
                    "{name} failed on a mutation of corpus file {i}: {:?}",
                    String::from_utf8_lossy(&m)
                );
            }
        }
    }
}
