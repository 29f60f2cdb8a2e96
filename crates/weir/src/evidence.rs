//! What a request showed of a person, as types: the collateral signal of a
//! refused request, its session's kind and the challenge's mark on it. The rules phase finds it (`policy::rules::collateral_signal`);
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

/// What a request's session proved, as the log records it (`session`):
/// [`crate::identity::session::SessionState`] without its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionKind {
    /// No session cookie weir checks.
    #[default]
    Anonymous,
    /// A checked login.
    Verified,
    /// A session cookie that failed its check.
    Unverified,
}

impl SessionKind {
    /// Its name in the access log and in metrics' `session` label.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Anonymous => "anonymous",
            SessionKind::Verified => "verified",
            SessionKind::Unverified => "unverified",
        }
    }
}

/// What the challenge made of a request, as the log records it
/// (`challenge`): the first event of a challenge response, or what a pass
/// it carried was worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeMark {
    /// The challenge page was served.
    Issued,
    /// An answer was right: a pass was minted.
    Solved,
    /// An answer was wrong, stale or replayed.
    Failed,
    /// weir's answer endpoint admitted a pass.
    PassAdmitted,
    /// weir's answer endpoint refused a pass.
    PassRejected,
    /// A valid pass that is proof here admitted the request.
    Pass,
    /// No pass came back, but the browser solved the work three times
    /// lately: admitted as proven.
    Looped,
    /// A valid no-script pass outside a visit weir counts as a person's:
    /// not proof.
    WaitPass,
}

impl ChallengeMark {
    /// Its name in the access log.
    pub fn as_str(self) -> &'static str {
        match self {
            ChallengeMark::Issued => "issued",
            ChallengeMark::Solved => "solved",
            ChallengeMark::Failed => "failed",
            ChallengeMark::PassAdmitted => "pass_admitted",
            ChallengeMark::PassRejected => "pass_rejected",
            ChallengeMark::Pass => "pass",
            ChallengeMark::Looped => "looped",
            ChallengeMark::WaitPass => "wait_pass",
        }
    }

    /// Whether the request was answered by the challenge itself (a page or
    /// a verdict), not by the app.
    pub fn is_challenge_answer(self) -> bool {
        matches!(
            self,
            ChallengeMark::Issued | ChallengeMark::Solved | ChallengeMark::Failed
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
