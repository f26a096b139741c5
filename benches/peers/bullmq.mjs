// BullMQ side of the Redis comparison (docs/performance.md): enqueue N no-op jobs (or jobs
// that each make one unfenced HINCRBY), run them with one worker at concurrency C, report
// jobs/s and the Redis CPU per job from INFO deltas. Run it against a private Redis.
//   cd benches/peers && npm install && node bullmq.mjs --redis redis://127.0.0.1:6390 --jobs 20000 [--write]
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i < 0 ? dflt : process.argv[i + 1];
};
const jobs = Number(arg("--jobs", 20000));
const concurrency = Number(arg("--concurrency", 50));
const url = arg("--redis", "redis://127.0.0.1:6390");
const write = process.argv.includes("--write");
const name = `bench-${process.pid}`;
const connection = { url, maxRetriesPerRequest: null };
const redis = new IORedis(url);

async function cpuSeconds() {
  const info = await redis.info("cpu");
  const field = (k) => Number(info.match(new RegExp(`${k}:([\\d.]+)`))[1]);
  return field("used_cpu_sys") + field("used_cpu_user");
}

const queue = new Queue(name, { connection });
for (let i = 0; i < jobs; i += 1000) {
  const batch = [];
  for (let k = i; k < Math.min(i + 1000, jobs); k++) {
    batch.push({ name: "noop", data: null, opts: { removeOnComplete: true } });
  }
  await queue.addBulk(batch);
}
const cpu0 = await cpuSeconds();
const t0 = process.hrtime.bigint();
let done = 0;
let finish;
const finished = new Promise((r) => (finish = r));
const worker = new Worker(
  name,
  async () => {
    if (write) await redis.hincrby(`${name}:n`, "n", 1);
  },
  { connection, concurrency },
);
worker.on("completed", () => {
  if (++done === jobs) finish();
});
await finished;
const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu = (await cpuSeconds()) - cpu0;
console.log(`BullMQ${write ? " + one HINCRBY per job" : " no-op"}: ${jobs} jobs, concurrency ${concurrency}`);
console.log(`  run ${(jobs / seconds).toFixed(0)} jobs/s (${seconds.toFixed(2)}s)`);
console.log(`  Redis CPU per job: run ${((cpu / jobs) * 1e6).toFixed(1)}µs`);
await worker.close();
await queue.obliterate({ force: true });
await queue.close();
await redis.del(`${name}:n`);
redis.disconnect();
