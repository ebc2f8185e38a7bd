//! Which way to fence: the out-of-service taint where the cluster has it,
//! the legacy recipe where it does not. Pure: the shell reads the server
//! version.

use serde::Serialize;

pub use crate::core::model::facts::FenceMode;

/// The configured choice (`FENCING_MODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeSetting {
    /// Decide by the API server's version.
    Auto,
    /// Always the out-of-service taint.
    Taint,
    /// Always the legacy recipe.
    Legacy,
}

impl ModeSetting {
    /// Parses `auto`, `taint` or `legacy`.
    pub fn parse(v: &str) -> Option<Self> {
        match v.to_ascii_lowercase().as_str() {
            "auto" => Some(Self::Auto),
            "taint" => Some(Self::Taint),
            "legacy" => Some(Self::Legacy),
            _ => None,
        }
    }

    /// The name, as configured.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Taint => "taint",
            Self::Legacy => "legacy",
        }
    }
}

/// The first minor version where the out-of-service taint works without a
/// feature gate (`NodeOutOfServiceVolumeDetach`: beta and on by default in
/// 1.26, GA in 1.28).
pub const TAINT_SINCE_MINOR: u32 = 26;

/// A Kubernetes server version, from `/version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ServerVersion {
    /// Major.
    pub(crate) major: u32,
    /// Minor.
    pub(crate) minor: u32,
}

impl ServerVersion {
    /// Reads `/version`'s `major` and `minor`, which managed offerings
    /// decorate (EKS and GKE say `"28+"`): the leading digits count.
    pub fn parse(major: &str, minor: &str) -> Option<Self> {
        let digits = |s: &str| -> Option<u32> {
            let d: String = s.chars().take_while(char::is_ascii_digit).collect();
            d.parse().ok()
        };
        Some(Self {
            major: digits(major)?,
            minor: digits(minor)?,
        })
    }

    /// The version from `/version`: its `major` and `minor`, or, where
    /// those do not read as numbers (some distributions leave them empty
    /// or spell them otherwise), its `gitVersion` (`v1.28.3-eks-1a2b3c`).
    pub fn read(major: &str, minor: &str, git_version: &str) -> Option<Self> {
        Self::parse(major, minor).or_else(|| {
            let mut parts = git_version.strip_prefix('v')?.split('.');
            Self::parse(parts.next()?, parts.next()?)
        })
    }

    /// True when the out-of-service taint is available.
    pub fn has_out_of_service_taint(self) -> bool {
        self.major > 1 || (self.major == 1 && self.minor >= TAINT_SINCE_MINOR)
    }
}

impl std::fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The mode in force: `auto` follows the server version; an explicit
/// setting wins (an operator who enabled the feature gate on 1.24 or 1.25
/// sets `taint`).
pub fn choose(setting: ModeSetting, version: ServerVersion) -> FenceMode {
    match setting {
        ModeSetting::Taint => FenceMode::Taint,
        ModeSetting::Legacy => FenceMode::Legacy,
        ModeSetting::Auto if version.has_out_of_service_taint() => FenceMode::Taint,
        ModeSetting::Auto => FenceMode::Legacy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_modes() {
        let v = |major, minor| ServerVersion::parse(major, minor).unwrap();
        assert_eq!(
            v("1", "28+"),
            ServerVersion {
                major: 1,
                minor: 28
            }
        );
        assert_eq!(ServerVersion::parse("1", ""), None);
        assert_eq!(ServerVersion::parse("", "28"), None);
        // Issue 58, item 10: an unreadable major or minor falls back to
        // the gitVersion.
        assert_eq!(
            ServerVersion::read("1", "", "v1.28.3-eks-1a2b3c"),
            Some(v("1", "28"))
        );
        assert_eq!(ServerVersion::read("", "", "v1.15.12"), Some(v("1", "15")));
        assert_eq!(
            ServerVersion::read("1", "30", "v9.99.0"),
            Some(v("1", "30"))
        );
        for git in ["", "v", "1.28.3", "v1", "vx.y", "v1.x"] {
            assert_eq!(ServerVersion::read("", "?", git), None, "{git:?}");
        }
        assert_eq!(choose(ModeSetting::Auto, v("1", "25")), FenceMode::Legacy);
        assert_eq!(choose(ModeSetting::Auto, v("1", "26")), FenceMode::Taint);
        assert_eq!(choose(ModeSetting::Auto, v("1", "36")), FenceMode::Taint);
        assert_eq!(choose(ModeSetting::Auto, v("2", "0")), FenceMode::Taint);
        assert_eq!(choose(ModeSetting::Taint, v("1", "20")), FenceMode::Taint);
        assert_eq!(choose(ModeSetting::Legacy, v("1", "36")), FenceMode::Legacy);
        for s in ["auto", "TAINT", "legacy"] {
            assert_eq!(ModeSetting::parse(s).unwrap().name(), s.to_lowercase());
        }
        assert_eq!(ModeSetting::parse("delete-node"), None);
    }
}
