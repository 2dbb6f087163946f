// `qual report`'s one call into Allure 3: build the report from qual's results and apply
// allurerc.mjs's quality gate in the same pass, so the report's Quality Gates tab shows the
// very rules that decide `qual report`'s exit status (`allure generate` alone leaves the tab
// empty: only `allure run` hands the gate's results to the report).
//   node build.mjs ALLURE_PACKAGE_DIR CONFIG RESULTS_DIR...
// Prints one JSON line, {"gate": [{"rule", "message"}, ...]} (empty: the gate passed), and
// exits 0 when the gate passed, 1 when it failed, 2 when the report could not be built.
// Like `allure generate`, it ends when Node has nothing left to do: the report's last step
// leaves a promise that never settles (3.14), so nothing here awaits it at the top level.
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [pkg, config, ...dirs] = process.argv.slice(2);

const build = async () => {
  const core = await import(
    pathToFileURL(createRequire(join(pkg, "package.json")).resolve("@allurereport/core")).href);
  const resolved = await core.readConfig(process.cwd(), config, {});
  const report = new core.AllureReport({ ...resolved, realTime: false });
  await report.start();
  for (const dir of dirs) {
    await report.readDirectory(dir);
  }
  let gate = [];
  if (resolved.qualityGate) {
    const trs = await report.store.allTestResults({ includeRetries: false });
    const knownIssues = await report.store.allKnownIssues();
    const { results } = await report.validate({ trs, knownIssues });
    // the rules' messages carry terminal colours, which the report's page would show as text
    // eslint-disable-next-line no-control-regex
    gate = results.map((r) => ({ ...r, message: r.message.replace(/\u001b\[[0-9;]*m/g, "") }));
    report.realtimeDispatcher.sendQualityGateResults(gate);
  }
  console.log(JSON.stringify({ gate: gate.map((r) => ({ rule: r.rule, message: r.message })) }));
  process.exitCode = gate.length ? 1 : 0;
  await report.done();
};

build().catch((error) => {
  console.error(error && error.stack ? error.stack : String(error));
  process.exitCode = 2;
});
