//! The catalogue of known Qwen3.5-family repos: the built-in list (`assets/catalog.toml`) and the
//! `[[catalog]]` entries of models.toml, which add repos or replace a built-in one of the same name.
//! The Download page lists them with what fits this machine (`engine::catalog::fit`).

use serde::{Deserialize, Serialize};
use ts_rs::TS;

use crate::hub::RepoRef;

/// The catalogue Tandem ships.
const BUILTIN: &str = include_str!("../../assets/catalog.toml");

/// A repo of the catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, TS)]
#[serde(deny_unknown_fields)]
pub struct CatalogEntry {
    /// `ORG/NAME` on the Hub.
    pub repo: String,
    pub format: CatalogFormat,
    /// Parameters, in billions.
    pub params_b: f64,
    /// Bits a weight as stored: 16 for bf16, else the affine quantization's width.
    pub bits: u8,
    /// The weights carry the MTP head.
    pub mtp: bool,
    #[serde(default)]
    pub vision: bool,
    /// For a conversion: the raw repo it came from (where a dropped MTP head can be fetched).
    #[serde(default)]
    #[ts(optional)]
    pub base: Option<String>,
    #[serde(default)]
    #[ts(optional)]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, TS)]
#[serde(rename_all = "lowercase")]
pub enum CatalogFormat {
    /// A raw Hugging Face checkpoint.
    Hf,
    /// An MLX conversion (mlx-lm / mlx-vlm layout).
    Mlx,
}

impl CatalogEntry {
    /// The weights' size, estimated from the parameters (an affine width b with groups of 64 costs
    /// b + 0.5 bits a weight: a bf16 scale and bias per group).
    pub fn estimated_bytes(&self) -> u64 {
        let bits = if self.bits >= 16 { 16.0 } else { self.bits as f64 + 0.5 };
        (self.params_b * 1e9 * bits / 8.0) as u64
    }

    /// What is wrong with the entry, if anything.
    pub fn check(&self) -> Result<(), String> {
        let repo_ok = self.repo.parse::<RepoRef>().is_ok_and(|r| r.revision == "main" && !self.repo.contains('@'));
        if !repo_ok {
            return Err(format!("repo = {:?}: must be ORG/NAME of a Hugging Face model", self.repo));
        }
        if !(self.params_b > 0.0 && self.params_b < 10_000.0) {
            return Err(format!("params_b = {}: must be the parameters in billions, above 0", self.params_b));
        }
        if !matches!(self.bits, 2..=8 | 16) {
            return Err(format!("bits = {}: must be 2 to 8, or 16 for bf16", self.bits));
        }
        if let Some(base) = &self.base {
            if base.parse::<RepoRef>().is_err() || base.contains('@') {
                return Err(format!("base = {base:?}: must be ORG/NAME of a Hugging Face model"));
            }
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    catalog: Vec<CatalogEntry>,
}

/// The built-in catalogue.
pub fn builtin() -> Vec<CatalogEntry> {
    // Checked by a test: a broken built-in file is a build defect, not a user's error.
    toml_edit::de::from_str::<CatalogFile>(BUILTIN).map(|f| f.catalog).unwrap_or_default()
}

/// The built-in entries with models.toml's own: an entry of the same repo replaces the built-in one
/// where it stands; new repos follow in file order.
pub fn merged(own: &[CatalogEntry]) -> Vec<CatalogEntry> {
    let mut all = builtin();
    for e in own {
        match all.iter_mut().find(|b| b.repo.eq_ignore_ascii_case(&e.repo)) {
            Some(b) => *b = e.clone(),
            None => all.push(e.clone()),
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_catalogue_parses_and_every_entry_is_valid() {
        let file: CatalogFile = toml_edit::de::from_str(BUILTIN).expect("assets/catalog.toml");
        assert!(!file.catalog.is_empty());
        for e in &file.catalog {
            e.check().unwrap_or_else(|m| panic!("{}: {m}", e.repo));
            // A conversion's base is a raw repo of the catalogue, with the head the conversion lacks.
            if let Some(base) = &e.base {
                let b = file.catalog.iter().find(|b| &b.repo == base).unwrap_or_else(|| panic!("{base}"));
                assert!(b.format == CatalogFormat::Hf && b.mtp, "{}: base {base}", e.repo);
            }
        }
        assert_eq!(builtin(), file.catalog);
    }

    #[test]
    fn own_entries_replace_builtin_ones_and_bad_ones_say_which_field() {
        let mut mine = builtin()[0].clone();
        mine.note = Some("mine".into());
        let extra = CatalogEntry { repo: "me/Qwen3.5-4B-5bit".into(), bits: 5, base: None, ..mine.clone() };
        let all = merged(&[mine.clone(), extra.clone()]);
        assert_eq!(all.len(), builtin().len() + 1);
        assert_eq!(all[0], mine);
        assert_eq!(all.last(), Some(&extra));
        // 27B in bf16: 54 GB; 4-bit with its scales: ~15 GB.
        let e = |bits| CatalogEntry { params_b: 27.0, bits, ..mine.clone() };
        assert_eq!(e(16).estimated_bytes(), 54_000_000_000);
        assert_eq!(e(4).estimated_bytes(), 15_187_500_000);
        for (bad, field) in [
            (CatalogEntry { bits: 12, ..mine.clone() }, "bits = 12"),
            (CatalogEntry { params_b: 0.0, ..mine.clone() }, "params_b = 0"),
            (CatalogEntry { repo: "nope".into(), ..mine.clone() }, "repo = \"nope\""),
            (CatalogEntry { base: Some("a/b@dev".into()), ..mine.clone() }, "base = \"a/b@dev\""),
        ] {
            let m = bad.check().unwrap_err();
            assert!(m.starts_with(field), "{m}");
        }
    }
}
