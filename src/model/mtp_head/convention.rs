//! Which convention the MTP head's seven RMSNorms follow: zero-centred (raw checkpoints, scale
//! `1 + w`) or shifted (MLX conversions, scale `w`). A wrong choice multiplies the head's features by
//! about 0 or 2 and drops MTP acceptance to about 0% without any error (docs/MODEL.md §3.6, §6.2).
//!
//! The decision comes from provenance facts wherever they exist:
//! - a head written together with its body by one tool follows the body: raw names on a raw body
//!   are zero-centred, MLX names in an MLX body's own files are shifted. Weight statistics never
//!   overrule these names (they used to, and a converted head whose norms happened to sit well
//!   below the body's final norm was "repaired" into the wrong convention);
//! - a re-attached head (names that disagree with the body's layout, or a head in an
//!   `mtp.safetensors` sidecar of an MLX conversion) carries names that are only a claim: people
//!   graft raw heads under MLX names and the reverse.
//!
//! Statistics are the fallback for the re-attached case, and the check for one failure no fact
//! reveals (a head shifted twice). They judge the head as a whole, because its seven norms were
//! written by one tool: each norm votes for the offset (0, 1 or 2 additions of 1) that puts its
//! mean effective scale nearest the body's final norm, with a margin of 0.5; only a majority of at
//! least 5 of 7 clear votes changes anything, and every message names the file, tensor and values.

use std::path::PathBuf;

use serde::Serialize;

use crate::model::layers::NormConvention;
use crate::model::store::Provenance;
use crate::model::weights::{Layout, Shard};

/// How a head norm's values are actually stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stored {
    ZeroCentred,
    Shifted,
    ShiftedTwice,
}

impl Stored {
    /// How many times 1 was added to the raw weight.
    pub fn offset(self) -> f32 {
        match self {
            Stored::ZeroCentred => 0.0,
            Stored::Shifted => 1.0,
            Stored::ShiftedTwice => 2.0,
        }
    }

    pub fn convention(self) -> NormConvention {
        match self {
            Stored::ZeroCentred => NormConvention::ZeroCentred,
            _ => NormConvention::Shifted,
        }
    }

    /// What a name of this provenance declares.
    pub fn declared_by(p: Provenance) -> Stored {
        match p {
            Provenance::Hf => Stored::ZeroCentred,
            Provenance::Mlx => Stored::Shifted,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Stored::ZeroCentred => "zero-centred",
            Stored::Shifted => "shifted",
            Stored::ShiftedTwice => "shifted twice",
        }
    }
}

/// Where the head came from, relative to the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadOrigin {
    /// Written with the body by one tool: its names are facts.
    WithBody,
    /// Re-attached to the body (the reason says how it shows): its names are a claim.
    Grafted(String),
}

/// Decides the head's origin from its tensors' names and files. `entries` are (canonical name,
/// provenance, file) of every tensor of the checkpoint.
pub fn head_origin<'a>(
    layout: Layout,
    entries: impl IntoIterator<Item = (&'a str, Provenance, &'a Shard)>,
) -> HeadOrigin {
    let body = match layout {
        Layout::Hf => Provenance::Hf,
        Layout::Mlx => Provenance::Mlx,
    };
    let (mut foreign, mut sidecar) = (None, None);
    let mut body_files = std::collections::BTreeSet::new();
    let mut head_files = std::collections::BTreeSet::new();
    for (name, prov, shard) in entries {
        if !name.starts_with("mtp.") {
            body_files.insert(shard.path.clone());
            continue;
        }
        head_files.insert(shard.path.clone());
        if prov != body && foreign.is_none() {
            foreign = Some(shard.name());
        }
        if shard.is_mtp_sidecar() && sidecar.is_none() {
            sidecar = Some(shard.name());
        }
    }
    // A shard that holds the head and nothing else (listed in the index or not): the head was
    // added to the folder after the body was written (converters mix the head into their shards).
    let own_shard = head_files.iter().find(|f| !body_files.contains(*f)).cloned();
    let sidecar = sidecar
        .or_else(|| own_shard.map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()));
    match (layout, foreign, sidecar) {
        (Layout::Mlx, Some(file), _) => {
            HeadOrigin::Grafted(format!("raw `mtp.*` names (in {file}) on an MLX conversion: a raw head re-attached to a converted body"))
        }
        (Layout::Hf, Some(file), _) => {
            HeadOrigin::Grafted(format!("MLX `language_model.mtp.*` names (in {file}) on a raw checkpoint: a converted head re-attached to a raw body"))
        }
        // Nothing shifts a raw head and keeps its raw names; official releases ship it in a sidecar.
        (Layout::Hf, None, _) => HeadOrigin::WithBody,
        (Layout::Mlx, None, Some(file)) => {
            HeadOrigin::Grafted(format!("MLX names in {file}, a file of the head alone beside the conversion rather than written with it"))
        }
        (Layout::Mlx, None, None) => HeadOrigin::WithBody,
    }
}

/// One stored head norm.
#[derive(Debug, Clone, Serialize)]
pub struct NormStat {
    /// Canonical name (`mtp.norm.weight`).
    pub name: String,
    /// Key in the file.
    pub key: String,
    pub file: PathBuf,
    pub provenance: Provenance,
    /// Mean of the stored values.
    pub mean: f32,
}

/// The body's final norm, the yardstick for the head's effective scales.
#[derive(Debug, Clone)]
pub struct Reference {
    pub key: String,
    pub file: PathBuf,
    /// Mean effective scale (the body's convention is a fact, decided by its layout).
    pub scale: f32,
}

/// One norm's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct NormVerdict {
    pub stat: NormStat,
    /// What its name declares.
    pub declared: Stored,
    /// How its values are taken to be stored.
    pub stored: Stored,
    /// What its own statistics say alone (its name's claim unless another offset is clearly
    /// nearer the body's final norm).
    pub vote: Stored,
}

#[derive(Debug, Clone)]
pub struct HeadDecision {
    pub origin: HeadOrigin,
    pub norms: Vec<NormVerdict>,
    /// Set when the statistics overruled the names of a re-attached head (the loader repairs it).
    pub repaired: Option<String>,
    /// Set when the head cannot run as stored (shifted twice): MTP must stay off.
    pub refused: Option<String>,
    /// Set when some norms disagree with the names but not enough to act: the names are followed.
    pub doubt: Option<String>,
}

impl HeadDecision {
    pub fn stored(&self, name: &str) -> Option<Stored> {
        self.norms.iter().find(|n| n.stat.name == name).map(|n| n.stored)
    }
}

/// A norm's vote must beat its name's claim by this much (in mean effective scale).
pub const MARGIN: f32 = 0.5;
/// How many of the seven norms must vote alike to act.
pub const MAJORITY: usize = 5;

fn file_name(p: &std::path::Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| p.display().to_string())
}

/// Decides how the head's norms are stored (see the module docs).
pub fn decide(origin: HeadOrigin, norms: Vec<NormStat>, reference: &Reference) -> HeadDecision {
    let scale = |mean: f32, s: Stored| mean + 1.0 - s.offset();
    let votes: Vec<(NormStat, Stored, Stored)> = norms
        .into_iter()
        .map(|n| {
            let declared = Stored::declared_by(n.provenance);
            let dist = |s: Stored| (scale(n.mean, s) - reference.scale).abs();
            let best = [Stored::ZeroCentred, Stored::Shifted, Stored::ShiftedTwice]
                .into_iter()
                .min_by(|a, b| dist(*a).total_cmp(&dist(*b)))
                .unwrap_or(declared);
            let vote = if best != declared && dist(best) + MARGIN < dist(declared) { best } else { declared };
            (n, declared, vote)
        })
        .collect();
    // A head written with its body keeps its names; only a second shift is looked for.
    let counts = |alt: Stored| {
        votes
            .iter()
            .filter(|(_, d, v)| {
                *v == alt
                    && *d != alt
                    && (matches!(origin, HeadOrigin::Grafted(_))
                        || (*d == Stored::Shifted && alt == Stored::ShiftedTwice))
            })
            .count()
    };
    let (alt, n) = [Stored::ZeroCentred, Stored::Shifted, Stored::ShiftedTwice]
        .into_iter()
        .map(|a| (a, counts(a)))
        .max_by_key(|(_, n)| *n)
        .unwrap_or((Stored::Shifted, 0));
    let listed = |pick: &dyn Fn(&Stored) -> bool| {
        votes
            .iter()
            .filter(|(_, _, v)| pick(v))
            .map(|(s, d, v)| {
                format!(
                    "{}: `{}` mean {:.3} (scale {:.3} if {}, {:.3} if {})",
                    file_name(&s.file),
                    s.key,
                    s.mean,
                    scale(s.mean, *d),
                    d.describe(),
                    scale(s.mean, *v),
                    v.describe()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let yardstick = format!(
        "the body's final norm {}: `{}` has mean scale {:.3}",
        file_name(&reference.file),
        reference.key,
        reference.scale
    );
    let total = votes.len();
    let mut d = HeadDecision { origin: origin.clone(), norms: Vec::new(), repaired: None, refused: None, doubt: None };
    let act = n >= MAJORITY.min(total.max(1));
    if n > 0 && act && alt == Stored::ShiftedTwice {
        d.refused = Some(format!(
            "{n} of {total} MTP norms look shifted twice (1 added two times): {}; {yardstick}",
            listed(&|v| *v == Stored::ShiftedTwice)
        ));
    } else if n > 0 && act {
        let why = match &origin {
            HeadOrigin::Grafted(why) => why.clone(),
            HeadOrigin::WithBody => "head written with its body".into(),
        };
        d.repaired = Some(format!(
            "MTP norm convention repaired for {total} tensor(s) ({why}; {n} of {total} norms are {} although named {}): {}; {yardstick}",
            alt.describe(),
            votes.first().map_or("", |(_, d, _)| d.describe()),
            listed(&|v| *v == alt)
        ));
    } else if n > 0 {
        d.doubt = Some(format!(
            "{n} of {total} MTP norms look {} although named otherwise, fewer than the {MAJORITY} needed to act; following the names: {}; {yardstick}",
            alt.describe(),
            listed(&|v| *v == alt)
        ));
    }
    d.norms = votes
        .into_iter()
        .map(|(stat, declared, vote)| {
            let stored = if n > 0 && act { alt } else { declared };
            NormVerdict { stat, declared, stored, vote }
        })
        .collect();
    d
}

#[cfg(test)]
mod tests;
