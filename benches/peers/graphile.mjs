// graphile-worker side of the Postgres comparison (docs/performance.md): enqueue N jobs, run
// them with one worker at concurrency C, report jobs/s and the Postgres CPU per job.
//   cd benches/peers && npm install && node graphile.mjs --jobs 10000 [--update]
// --update: each job runs one unfenced UPDATE of one row of a 1,000-row table, the work the
// Palisade harness's `--postgres` job fences. Uses a fresh schema in database `test`, dropped
// afterwards.
import { run, makeWorkerUtils } from "graphile-worker";
import pg from "pg";
import { readFileSync, readdirSync } from "node:fs";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i < 0 ? dflt : process.argv[i + 1];
};
const jobs = Number(arg("--jobs", 10000));
const concurrency = Number(arg("--concurrency", 50));
const update = process.argv.includes("--update");
const connectionString = arg("--url", "postgres://postgres@127.0.0.1/test");
const schema = `gw_bench_${process.pid}`;

// utime + stime + cutime + cstime of every postgres process (exited backends count in the
// postmaster's children's times), in seconds.
function postgresCpu() {
  let ticks = 0;
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    let stat;
    try { stat = readFileSync(`/proc/${pid}/stat`, "utf8"); } catch { continue; }
    const close = stat.lastIndexOf(")");
    if (!stat.slice(0, close).endsWith("(postgres")) continue;
    const f = stat.slice(close + 2).split(" ");
    ticks += Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14]);
  }
  return ticks / 100;
}

const pool = new pg.Pool({ connectionString, max: concurrency + 2 });
await pool.query(`CREATE SCHEMA ${schema}`);
await pool.query(`CREATE TABLE ${schema}.account (id bigint PRIMARY KEY, n bigint NOT NULL);
  INSERT INTO ${schema}.account SELECT i, 0 FROM generate_series(0, 999) i`);
const workerSchema = `${schema}_gw`;
const utils = await makeWorkerUtils({ pgPool: pool, schema: workerSchema });
await utils.migrate();
for (let i = 0; i < jobs; i += 1000) {
  const specs = [];
  for (let k = i; k < Math.min(i + 1000, jobs); k++) {
    specs.push({ identifier: "job", payload: { row: k % 1000 } });
  }
  await utils.addJobs(specs);
}
const cpu0 = postgresCpu();
const t0 = process.hrtime.bigint();
const runner = await run({
  pgPool: pool,
  schema: workerSchema,
  concurrency,
  noHandleSignals: true,
  pollInterval: 1000,
  logger: new (await import("graphile-worker")).Logger(() => () => {}),
  taskList: {
    job: async (payload, helpers) => {
      if (update) {
        await helpers.query(`UPDATE ${schema}.account SET n = n + 1 WHERE id = $1`, [payload.row]);
      }
    },
  },
});
for (;;) {
  const { rows } = await pool.query(`SELECT count(*)::int AS n FROM ${workerSchema}._private_jobs`);
  if (rows[0].n === 0) break;
  await new Promise((r) => setTimeout(r, 5));
}
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu = postgresCpu() - cpu0;
await runner.stop();
if (update) {
  const { rows } = await pool.query(`SELECT sum(n)::bigint AS s FROM ${schema}.account`);
  if (Number(rows[0].s) !== jobs) throw new Error(`updates applied ${rows[0].s}, expected ${jobs}`);
}
console.log(`graphile-worker${update ? " + one UPDATE per job" : " no-op"}: ${jobs} jobs, concurrency ${concurrency}`);
console.log(`  run ${(jobs / seconds).toFixed(0)} jobs/s (${seconds.toFixed(2)}s)`);
console.log(`  Postgres CPU per job ${((cpu / jobs) * 1e6).toFixed(1)}µs (every postgres process on this machine)`);
await pool.query(`DROP SCHEMA ${schema} CASCADE; DROP SCHEMA ${workerSchema} CASCADE`);
await utils.release();
await pool.end();
