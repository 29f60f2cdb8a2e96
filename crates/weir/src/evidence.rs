//! What a refused request showed of a person: the collateral signal, as a
//! type. The rules phase finds it (`policy::rules::collateral_signal`);
//! the access log, metrics, the people timeline and `weir replay` carry and
//! count it. Here so that none of those has to know the rules to ask
//! whether a signal is evidence of a person, or compare strings to.
//!
//! Does not: find the signal, or say what each costs a crawler to forge
//! (`docs/metrics.md`).

/// Why a refused client may be a person rather than a crawler, strongest
/// evidence first: the first three are evidence of a person, the last two
/// hints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collateral {
    /// A session the app vouched for.
    Verified,
    /// A valid challenge pass.
    Pass,
    /// A navigation in a visit weir itself counted (`crate::visit`).
    Browsing,
    /// The address sends little.
    LowRate,
    /// A browser navigation's headers.
    Browser,
}

impl Collateral {
    /// Every signal, strongest first.
    pub const ALL: [Collateral; 5] = [
        Collateral::Verified,
        Collateral::Pass,
        Collateral::Browsing,
        Collateral::LowRate,
        Collateral::Browser,
    ];

    /// Its name in the access log (`collateral`) and in metrics' `signal`
    /// label.
    pub fn as_str(self) -> &'static str {
        match self {
            Collateral::Verified => "verified",
            Collateral::Pass => "pass",
            Collateral::Browsing => "browsing",
            Collateral::LowRate => "low_rate",
            Collateral::Browser => "browser",
        }
    }

    /// The signal an access log line names, if it names one.
    pub fn from_name(name: &str) -> Option<Collateral> {
        Collateral::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// Whether it is evidence of a person (`verified`, `pass`,
    /// `browsing`), not only a hint: what the `WeirRuleHittingPeople`
    /// alert, the replay's people line and the lab's precision count.
    pub fn is_person_evidence(self) -> bool {
        matches!(
            self,
            Collateral::Verified | Collateral::Pass | Collateral::Browsing
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_only_three_are_evidence() {
        for c in Collateral::ALL {
            assert_eq!(Collateral::from_name(c.as_str()), Some(c));
        }
        assert_eq!(Collateral::from_name("Verified"), None);
        let evidence: Vec<_> = (Collateral::ALL.into_iter())
            .filter(|c| c.is_person_evidence())
            .map(Collateral::as_str)
            .collect();
        assert_eq!(evidence, ["verified", "pass", "browsing"]);
    }
}
