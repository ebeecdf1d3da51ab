// What the integration tests share.

/// n deterministic values in [-scale / 2, scale / 2) (a linear congruential generator from seed).
pub fn data(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            ((s >> 8) as f32 / 16777216.0 - 0.5) * scale
        })
        .collect()
}
