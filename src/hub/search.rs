//! Searching the Hub's models by name (`GET /api/models?search=…`), for the Download page: the repos
//! whose names match, most downloaded first.

use serde::{Deserialize, Serialize};

use super::{agent, encode, request_range, HubConfig, HubError};

/// A repo the Hub's search found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ts_rs::TS)]
pub struct HubModel {
    /// `ORG/NAME`.
    pub id: String,
    #[serde(default)]
    pub downloads: u64,
    #[serde(default)]
    pub likes: u64,
    /// The Hub's tags (`mlx`, `safetensors`, `4-bit`, …): what kind of checkpoint it is.
    #[serde(default)]
    pub tags: Vec<String>,
}

/// The most downloaded repos whose names contain `query` (at most `limit`, at most 100).
pub fn search(cfg: &HubConfig, query: &str, limit: usize) -> Result<Vec<HubModel>, HubError> {
    if cfg.offline {
        return Err(HubError::OfflineSearch);
    }
    let query = query.trim();
    if query.is_empty() || query.len() > 200 {
        return Err(HubError::BadQuery(query.chars().take(40).collect()));
    }
    let limit = limit.clamp(1, 100);
    let url = format!("{}/api/models?search={}&sort=downloads&direction=-1&limit={limit}", cfg.endpoint, encode(query));
    let mut res = request_range(cfg, &agent(), &url, 0, None)?;
    match res.status().as_u16() {
        200 => {}
        status => return Err(HubError::Http { url, status }),
    }
    let bad = |message: String| HubError::BadListing { url: url.clone(), message };
    let text = res.body_mut().with_config().limit(16 << 20).read_to_string().map_err(|e| bad(e.to_string()))?;
    let mut found: Vec<HubModel> = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    // Only names a pull would accept.
    found.retain(|m| m.id.parse::<super::RepoRef>().is_ok());
    found.truncate(limit);
    Ok(found)
}
