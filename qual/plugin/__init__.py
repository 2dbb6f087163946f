"""qual's pytest plugin: `hooks` (options, fixtures, markers; loaded by pytest through the
`pytest11` entry point), `session` (profile, targets, run record, Allure results) and
`recorder` (one test's measurements, judged by qual.judge)."""
