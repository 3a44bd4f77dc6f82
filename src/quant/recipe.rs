//! Which linear layers are quantized, at how many bits.
//!
//! - `uniform`: every quantizable layer at `bits`.
//! - `mixed_3_6`, `mixed_4_6`: mlx-lm's recipes (`mlx_lm/convert.py`, after llama.cpp's Q4_K_M): the
//!   low width everywhere, 6 bits for `lm_head` and, in the first and last eighth of the layers and in
//!   every third layer between, for `v_proj` and `down_proj`. For Qwen3.5's Gated DeltaNet layers,
//!   which have no `v_proj`, the value projection is part of the fused `in_proj_qkv`, so that layer
//!   takes the high width on the same layers (`out_proj`, like `o_proj`, stays low). With tied
//!   embeddings the embedding is the output head and takes the head's width (as llama.cpp does;
//!   mlx-lm, having no `lm_head` module then, leaves it low). The MTP layer counts as a high-bit layer
//!   (it sits after the last one).
//! - `auto`: widths chosen from measured sensitivity (`calibrate.rs`) by [`allocate`].
//!
//! A layer is quantizable, as in mlx-lm, when it is a linear or embedding whose input width is
//! divisible by the group size and the architecture's `quant_predicate` allows it (Qwen3.5 keeps
//! `mtp.fc` in full precision, oMLX's MTP-aware rule); the predicate also says which modules are
//! the sensitive ones of the mixed recipes.

use std::collections::BTreeMap;

use super::options::{ConvertOptions, MtpBits, Recipe, SUPPORTED_BITS};
use crate::model::qwen3_5::{quant_predicate, LinearKind, QuantClass};

/// How one module is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct QuantParams {
    pub bits: u8,
    pub group_size: u32,
}

/// A linear module as the recipe sees it.
#[derive(Debug, Clone)]
pub struct Module {
    /// Canonical module name (`layers.3.mlp.down_proj`).
    pub name: String,
    pub kind: LinearKind,
    pub out: i32,
    pub inp: i32,
    /// Decoder layer index (None for the MTP head and global modules).
    pub layer: Option<usize>,
    pub is_mtp: bool,
}

impl Module {
    pub fn params(&self) -> u64 {
        self.out as u64 * self.inp as u64
    }
    /// Whether MLX can quantize it with this group size (mlx-lm's rule).
    pub fn quantizable(&self, group_size: u32) -> bool {
        quant_predicate(self.kind) != QuantClass::Never && self.inp > 0 && self.inp as u32 % group_size == 0
    }
}

/// mlx-lm's `use_more_bits` for layer `index` of `n`.
pub fn use_more_bits(index: usize, n: usize) -> bool {
    let (i, n) = (index as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8).rem_euclid(3) == 2
}

/// (low, high) bits of a mixed recipe.
pub fn mixed_bits(recipe: Recipe) -> Option<(u8, u8)> {
    match recipe {
        Recipe::Mixed36 => Some((3, 6)),
        Recipe::Mixed46 => Some((4, 6)),
        _ => None,
    }
}

/// The bits a non-auto recipe gives `m` (before the MTP override and the divisibility rule).
fn recipe_bits(m: &Module, opts: &ConvertOptions, n_layers: usize, tied: bool) -> Option<u8> {
    match opts.recipe {
        Recipe::Uniform | Recipe::Auto => opts.bits,
        Recipe::Mixed36 | Recipe::Mixed46 => {
            let (low, high) = mixed_bits(opts.recipe)?;
            let more = m.is_mtp || m.layer.is_some_and(|i| use_more_bits(i, n_layers));
            let high_here = match quant_predicate(m.kind) {
                QuantClass::OutputHead => true,
                QuantClass::Embedding => tied,
                QuantClass::Sensitive => more,
                QuantClass::Never | QuantClass::Plain => false,
            };
            Some(if high_here { high } else { low })
        }
    }
}

/// Decides every module's storage. `auto` supplies the widths chosen by [`allocate`].
pub fn assign(
    modules: &[Module],
    opts: &ConvertOptions,
    n_layers: usize,
    tied: bool,
    auto: Option<&BTreeMap<String, Option<u8>>>,
) -> BTreeMap<String, Option<QuantParams>> {
    let g = opts.group_size;
    modules
        .iter()
        .map(|m| {
            let bits = if !m.quantizable(g) {
                None
            } else if let (true, Some(mb)) = (m.is_mtp, opts.mtp_bits) {
                match mb {
                    MtpBits::Dense => None,
                    MtpBits::Bits(b) => Some(b),
                }
            } else if let (Recipe::Auto, Some(auto)) = (opts.recipe, auto) {
                auto.get(&m.name).copied().flatten()
            } else {
                recipe_bits(m, opts, n_layers, tied)
            };
            (m.name.clone(), bits.map(|bits| QuantParams { bits, group_size: g }))
        })
        .collect()
}

/// Bits one weight costs at `bits` with `group_size` (a 16-bit scale and bias per group).
pub fn bits_per_weight(bits: u8, group_size: u32, dense_bits: u32) -> f64 {
    if bits == 0 {
        dense_bits as f64
    } else {
        bits as f64 + 32.0 / group_size as f64
    }
}

/// A module's measured output error at each width (`0` = full precision, error 0).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sensitivity {
    pub module: String,
    pub params: u64,
    /// (bits, relative output error ||xW^T - xŴ^T|| / ||xW^T||), bits ascending.
    pub errors: Vec<(u8, f64)>,
}

/// Greedy allocation: every module starts at the smallest width; then, while the budget allows,
/// the upgrade (to any larger width, or full precision) that removes the most error per extra bit
/// spent is taken. `budget_bits` is what the quantizable modules may use in total.
/// Returns each module's width (None = full precision) and the bits used.
pub fn allocate(
    sens: &[Sensitivity],
    group_size: u32,
    dense_bits: u32,
    budget_bits: f64,
) -> (BTreeMap<String, Option<u8>>, f64) {
    // Options per module: (bits code, cost in bits, error); code 0 is full precision.
    let options: Vec<Vec<(u8, f64, f64)>> = sens
        .iter()
        .map(|s| {
            let mut o: Vec<(u8, f64, f64)> = s
                .errors
                .iter()
                .filter(|(b, _)| SUPPORTED_BITS.contains(b))
                .map(|&(b, e)| (b, s.params as f64 * bits_per_weight(b, group_size, dense_bits), e))
                .collect();
            o.push((0, s.params as f64 * dense_bits as f64, 0.0));
            o.sort_by(|a, b| a.1.total_cmp(&b.1));
            o
        })
        .collect();
    let mut at: Vec<usize> = vec![0; sens.len()];
    let mut used: f64 = options.iter().map(|o| o.first().map_or(0.0, |x| x.1)).sum();
    loop {
        let mut best: Option<(f64, usize, usize)> = None;
        for (m, opts) in options.iter().enumerate() {
            let (_, cost0, err0) = opts[at[m]];
            for (j, &(_, cost, err)) in opts.iter().enumerate().skip(at[m] + 1) {
                let extra = cost - cost0;
                if extra <= 0.0 || used + extra > budget_bits || err >= err0 {
                    continue;
                }
                let gain = (err0 - err) / extra;
                if best.is_none_or(|(g, _, _)| gain > g) {
                    best = Some((gain, m, j));
                }
            }
        }
        let Some((_, m, j)) = best else { break };
        used += options[m][j].1 - options[m][at[m]].1;
        at[m] = j;
    }
    let chosen = sens
        .iter()
        .zip(&options)
        .zip(&at)
        .map(|((s, o), &j)| (s.module.clone(), if o[j].0 == 0 { None } else { Some(o[j].0) }))
        .collect();
    (chosen, used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_bits_layers_match_mlx_lm() {
        // mlx-lm for 8 layers: 0 (first eighth), 7 (last eighth), and (i - 1) % 3 == 2: 3, 6.
        let more: Vec<usize> = (0..8).filter(|&i| use_more_bits(i, 8)).collect();
        assert_eq!(more, vec![0, 3, 6, 7]);
        let more: Vec<usize> = (0..24).filter(|&i| use_more_bits(i, 24)).collect();
        assert_eq!(more, vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]);
    }

    #[test]
    fn allocation_spends_bits_where_error_drops_most() {
        let s = |name: &str, params: u64, e: [f64; 6]| Sensitivity {
            module: name.into(),
            params,
            errors: SUPPORTED_BITS.iter().copied().zip(e).collect(),
        };
        let sens = vec![
            s("sensitive", 1000, [0.8, 0.4, 0.2, 0.1, 0.05, 0.01]),
            s("robust", 1000, [0.08, 0.04, 0.02, 0.01, 0.005, 0.001]),
        ];
        // Budget for 4.5 + 2.5 bits per weight on average: the sensitive module gets more.
        let budget = 1000.0 * (4.5 + 2.5);
        let (chosen, used) = allocate(&sens, 64, 16, budget);
        assert!(used <= budget);
        let (a, b) = (chosen["sensitive"].unwrap(), chosen["robust"].unwrap());
        assert!(a > b, "sensitive {a} bits, robust {b} bits");
        // A budget that cannot pay for more than the floor leaves the floor.
        let (chosen, _) = allocate(&sens, 64, 16, 1000.0 * 5.0);
        assert_eq!(chosen["sensitive"], Some(2));
        // A huge budget keeps everything in full precision.
        let (chosen, _) = allocate(&sens, 64, 16, 1e9);
        assert_eq!(chosen["robust"], None);
    }
}
