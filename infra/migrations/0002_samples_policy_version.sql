-- The dashboard and the audits summarise samples by the policy version that generated them (reward by
-- version, components by version); without this index each such query scans every sample ever stored.
CREATE INDEX samples_policy_version ON samples (policy_version);
