// Allure 3 configuration for qual's qualification reports; `qual report` sets the variables.
//   QUAL_REPORT_NAME      report title: drive model, firmware and profile
//   QUAL_OUTPUT           the report folder
//   QUAL_HISTORY          JSONL history file: trends across runs (firmware versions)
//   QUAL_SINGLE_FILE      "1": one self-contained HTML file (for an acceptance email)
//   QUAL_GATE_SEVERITIES  severities whose failed test fails the gate, e.g. "blocker,critical"
//   QUAL_VARIABLES        JSON object shown first on the landing page: the verdict, the drive,
//                         each failed or inconclusive criterion (qual.report.front_page)
// A plain object, not defineConfig() from "allure": that import would not resolve from here
// when the CLI is installed globally, and defineConfig returns its argument unchanged.
const env = process.env;
const gated = (env.QUAL_GATE_SEVERITIES || "blocker,critical,normal").split(",");
const severity = (tr) => (tr.labels.find((l) => l.name === "severity") || {}).value || "normal";

export default {
  name: env.QUAL_REPORT_NAME || "qual qualification",
  output: env.QUAL_OUTPUT || "allure-report",
  historyPath: env.QUAL_HISTORY || undefined,
  variables: JSON.parse(env.QUAL_VARIABLES || "{}"),
  plugins: {
    awesome: {
      options: {
        reportName: env.QUAL_REPORT_NAME || "qual qualification",
        singleFile: env.QUAL_SINGLE_FILE === "1",
        groupBy: ["epic", "feature", "story"],
      },
    },
  },
  // The first matching rule wins. A threshold or baseline violation fails a test (failed);
  // an engine or target error breaks it (broken); a workload the profile lacks skips it.
  categories: [
    { name: "Threshold violations", matchers: { statuses: ["failed"], message: /\] = .* (<|>) (min|max) / } },
    { name: "Baseline regressions", matchers: { statuses: ["failed"], message: /worse than baseline/ } },
    { name: "Unsafe target refused", matchers: { statuses: ["broken"], trace: /UnsafeTarget/ } },
    { name: "Implausible measurements", matchers: { statuses: ["broken"], trace: /ImplausibleMeasurement/ } },
    { name: "Engine errors", matchers: { statuses: ["broken"], trace: /QualError|DeviceIoError|DataMismatch|NoSpace|TargetUnavailable|InvalidJob|BackendUnavailable|Cancelled/ } },
    { name: "Infrastructure errors", matchers: { statuses: ["broken"] } },
    { name: "Not applicable", matchers: { statuses: ["skipped"] } },
  ],
  // The gate: no failed or broken test of a gated severity (the profile's `gate`).
  qualityGate: {
    rules: [{ id: "qualification", maxFailures: 0, filter: (tr) => gated.includes(severity(tr)) }],
  },
};
