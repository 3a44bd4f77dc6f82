//! Custom GPU kernels, each beside the MLX op it replaces. The kernel sources live in the top-level
//! `kernels/` folder (kernels/README.md lists them with their tolerances and figures) and are compiled by
//! MLX's custom-kernel API on first use. A kernel is taken only on the backend and shapes its parity test
//! covers, on machine classes where that test passed, after a small parity probe on this machine; every
//! other call goes to the MLX op. `TANDEM_KERNELS=off` turns them all off. `fused` holds the elementwise
//! chains MLX's graph compiler fuses on every backend (`TANDEM_COMPILE=off` runs them op by op).

pub mod fused;
pub mod quantized_matmul;

pub use quantized_matmul::quantized_matmul;

use std::sync::OnceLock;

/// What `TANDEM_KERNELS` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Unset or `auto`: kernels on the machine classes where their parity tests passed.
    Auto,
    /// `off`: MLX's ops only.
    Off,
    /// `on`: also on GPUs of the right backend whose class has not been tested (the probe still runs).
    On,
}

impl Policy {
    fn parse(v: Option<&str>) -> Policy {
        match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
            Some("off" | "0" | "false" | "no") => Policy::Off,
            Some("on" | "1" | "true" | "yes") => Policy::On,
            Some("auto" | "") | None => Policy::Auto,
            Some(other) => {
                tracing::warn!("TANDEM_KERNELS={other:?} is not one of auto, on, off; using auto");
                Policy::Auto
            }
        }
    }
}

/// The policy of this process, read once from `TANDEM_KERNELS`.
pub fn policy() -> Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    *POLICY.get_or_init(|| Policy::parse(std::env::var("TANDEM_KERNELS").ok().as_deref()))
}

#[cfg(test)]
mod tests {
    use super::Policy;

    #[test]
    fn policy_values() {
        assert_eq!(Policy::parse(None), Policy::Auto);
        assert_eq!(Policy::parse(Some("auto")), Policy::Auto);
        assert_eq!(Policy::parse(Some(" OFF ")), Policy::Off);
        assert_eq!(Policy::parse(Some("0")), Policy::Off);
        assert_eq!(Policy::parse(Some("on")), Policy::On);
        assert_eq!(Policy::parse(Some("sometimes")), Policy::Auto);
    }
}
