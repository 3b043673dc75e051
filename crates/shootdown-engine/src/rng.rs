//! Deterministic randomness. ChaCha8 is specified bit-for-bit, so a (seed, stream) pair gives
//! the same numbers on every platform and every thread count.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
pub struct DetRng(ChaCha8Rng);

impl DetRng {
    /// `stream` separates independent consumers (e.g. repetitions) of one seed.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(stream);
        DetRng(r)
    }
    /// Uniform in `0..n` (`n == 0` gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.0.gen_range(0..n)
        }
    }
    /// Uniform in `[0,1)`.
    pub fn unit(&mut self) -> f64 {
        self.0.gen::<f64>()
    }
}

/// Derive a well-mixed child seed (SplitMix64 finaliser) so that neighbouring repetitions do not
/// get correlated streams.
pub fn mix_seed(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
