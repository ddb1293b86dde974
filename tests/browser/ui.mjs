#!/usr/bin/env node
// Drives the /ui/ dashboard in headless Chromium against a running gateway,
// the way a person and a curl user would together:
//
//   node tests/browser/ui.mjs http://127.0.0.1:8080
//
// 1. opens <base>/ui/ and adds the key `ui-test-key` through the page;
// 2. PUTs a value with plain fetch (not through the page) and waits until
//    the page shows that value and the version the PUT returned;
// 3. DELETEs with fetch and waits until the page shows the key as absent;
// 4. sets a value through the page's own form and checks with a GET that
//    the store holds it;
// 5. reloads the page: the watched key list survives (localStorage);
// 6. the key browser: lists keys written with fetch by a glob, pages with
//    "More keys", a click watches a key, whose numeric values then draw a
//    sparkline; with SCREENSHOT set, writes a screenshot of the page there;
// 7. stops watching through the page.
//
// Any wait is bounded. On failure: a message on stderr, a screenshot in a
// temporary directory, and exit status 1. The page must also run without a
// script error or a Content-Security-Policy violation.
//
// CHROMIUM overrides the browser (default /usr/bin/chromium). With
// API_TOKEN set, the gateway is expected to require that token: the page
// must first say so, then work once the token is entered in its form (the
// stream carries it as access_token, fetch as a bearer header); this
// script's own requests send it as a bearer header.

import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const KEY = 'ui-test-key';
const WAIT_MS = 10_000;
const REQUEST_MS = 5_000;
const OVERALL_MS = 50_000;
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const API_TOKEN = process.env.API_TOKEN || '';
const SCREENSHOT = process.env.SCREENSHOT || '';
// The listing test's keys: more than one page of the browser (20).
const LISTED = Array.from({ length: 23 }, (_, n) => `ui-list/room-${String(n).padStart(2, '0')}`);
const SPARK_KEY = 'ui-list/temperature';
// Without the background-networking flags Chromium keeps dialling out, and
// a closed network refuses it; none of that traffic is needed here.
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

class TestFailure extends Error {}

function fail(message) {
  throw new TestFailure(message);
}

function step(message) {
  console.log(`ui test: ${message}`);
}

function parseBase(arg) {
  if (!arg) fail('usage: node ui.mjs <base-url>, for example http://127.0.0.1:8080');
  let url;
  try {
    url = new URL(arg);
  } catch {
    fail(`not a URL: ${arg}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') fail(`not an http(s) URL: ${arg}`);
  // Keep any path prefix, always with one trailing slash.
  url.pathname = url.pathname.replace(/\/*$/, '/');
  url.search = '';
  url.hash = '';
  return url;
}

/** curl-style: plain fetch from node, bounded. */
async function http(method, url, { body, accept } = {}) {
  const init = { method, signal: AbortSignal.timeout(REQUEST_MS), headers: {} };
  if (API_TOKEN) init.headers.Authorization = `Bearer ${API_TOKEN}`;
  if (body !== undefined) init.body = body;
  if (accept) init.headers.Accept = accept;
  try {
    return await fetch(url, init);
  } catch (err) {
    fail(`${method} ${url} failed: ${err.cause?.message ?? err.message}`);
  }
}

async function expectStatus(response, expected, what) {
  if (!expected.includes(response.status)) {
    const body = await response.text().catch(() => '');
    fail(`${what}: expected HTTP ${expected.join(' or ')}, got ${response.status}: ${body.slice(0, 300)}`);
  }
}

/** What the page shows for `key`: its row's state and cells, or null. */
async function readRow(page, key) {
  return page.evaluate((key) => {
    const row = [...document.querySelectorAll('#rows tr')].find((tr) => tr.dataset.key === key);
    if (!row) return null;
    return {
      exists: row.dataset.exists,
      kind: row.dataset.kind,
      marker: row.querySelector('.value .marker').textContent,
      value: row.querySelector('.value .text').textContent,
      version: row.querySelector('.version').textContent,
    };
  }, key);
}

/** Polls the page (bounded) until the row of `key` satisfies `predicate`. */
async function waitForRow(page, key, description, predicate) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const cells = await readRow(page, key);
    if (cells && predicate(cells)) return cells;
    if (Date.now() > deadline) {
      fail(`the page did not show ${description} within ${WAIT_MS / 1000} s; it shows ${await describeRow(page, key)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function describeRow(page, key) {
  return page.evaluate((key) => {
    const row = [...document.querySelectorAll('#rows tr')].find((tr) => tr.dataset.key === key);
    const state = document.getElementById('connection-text').textContent;
    const errors = [...document.querySelectorAll('#errors .error .text')].map((e) => e.textContent);
    if (!row) return `no row for ${key} (connection: ${state}; errors: ${JSON.stringify(errors)})`;
    return JSON.stringify({
      connection: state,
      exists: row.dataset.exists,
      kind: row.dataset.kind,
      row: row.innerText.replace(/\s+/g, ' ').trim(),
      errors,
    });
  }, key);
}

async function run(base, problems, session) {
  const keyUrl = new URL(`keys/${encodeURIComponent(KEY)}`, base);
  const token = randomBytes(6).toString('hex');

  step(`starting from an absent key (${keyUrl})`);
  await expectStatus(await http('DELETE', keyUrl), [204, 404], 'DELETE before the test');

  session.userDataDir = await mkdtemp(path.join(tmpdir(), 'ui-test-chromium-'));
  let context;
  try {
    context = await chromium.launchPersistentContext(session.userDataDir, {
      executablePath: CHROMIUM,
      headless: true,
      args: CHROMIUM_ARGS,
      timeout: 20_000,
    });
  } catch (err) {
    fail(`Chromium (${CHROMIUM}) did not start: ${err.message}. Run scripts/install-browser-deps`);
  }
  session.context = context;
  const page = context.pages()[0] ?? (await context.newPage());
  session.page = page;
  page.setDefaultTimeout(WAIT_MS);
  page.on('pageerror', (err) => problems.push(`script error: ${err.message}`));
  page.on('console', (msg) => {
    const text = msg.text();
    // A blocked inline script or style says so on the console.
    if (/Content Security Policy|Refused to/i.test(text)) problems.push(`CSP: ${text}`);
    else if (msg.type() === 'error') console.error(`ui test: page console: ${text}`);
  });

  const pageUrl = new URL('ui/', base);
  step(`opening ${pageUrl}`);
  const response = await page.goto(pageUrl.href, { waitUntil: 'load' });
  if (!response || response.status() !== 200) fail(`GET ${pageUrl} answered ${response?.status()}`);
  const csp = response.headers()['content-security-policy'] ?? '';
  if (!csp.includes("default-src 'self'")) fail(`the page has no strict CSP: "${csp}"`);

  step(`adding ${KEY} through the page`);
  await page.getByLabel('Key to watch').fill(KEY);
  await page.getByRole('button', { name: 'Watch', exact: true }).click();
  if (API_TOKEN) {
    step('the gateway wants a token: the page says so; entering it');
    await page
      .locator('#connection-text')
      .filter({ hasText: 'needs its API token' })
      .waitFor({ timeout: WAIT_MS })
      .catch(() => fail(`the page did not ask for the token: ${JSON.stringify(problems)}`));
    await page.evaluate(() => {
      document.getElementById('token-box').open = true;
    });
    await page.locator('#token').fill(API_TOKEN);
    await page.getByRole('button', { name: 'Use', exact: true }).click();
  }
  await waitForRow(page, KEY, 'the key as absent after its first sync', (c) => c.kind === 'sync' && c.exists === 'false');
  const connection = await page.locator('#connection').getAttribute('data-state');
  if (connection !== 'live') fail(`the connection state is ${connection}, not live`);
  const stored = await page.evaluate(() => localStorage.getItem('statestore-gateway.ui.keys'));
  if (stored !== JSON.stringify([KEY])) fail(`localStorage holds ${stored}`);

  const curlValue = `hello from curl ${token}`;
  step(`PUT "${curlValue}" with fetch`);
  const put = await http('PUT', keyUrl, { body: curlValue });
  await expectStatus(put, [200], 'PUT from curl');
  const { version } = await put.json();
  if (typeof version !== 'string' || version === '') fail(`PUT answered no version`);
  await waitForRow(
    page,
    KEY,
    `"${curlValue}" at version ${version}`,
    (c) => c.kind === 'set' && c.value === curlValue && c.version === version,
  );

  step('DELETE with fetch');
  await expectStatus(await http('DELETE', keyUrl), [204], 'DELETE from curl');
  await waitForRow(
    page,
    KEY,
    'the key as absent after the delete',
    (c) => c.kind === 'delete' && c.exists === 'false' && c.marker === 'absent' && c.value === '',
  );

  // Not only ASCII: the page must send UTF-8.
  const pageValue = `set from the page ${token} ✓ é`;
  step(`setting "${pageValue}" through the page's form`);
  await page.getByLabel(`New value for ${KEY}`).fill(pageValue);
  await page.getByRole('button', { name: `Set ${KEY}`, exact: true }).click();
  await page.locator('#notice').filter({ hasText: `Set ${KEY} (version` }).waitFor({ timeout: WAIT_MS });
  const get = await http('GET', keyUrl, { accept: 'application/json' });
  await expectStatus(get, [200], 'GET after the page set the value');
  const held = await get.json();
  if (held.value !== pageValue) fail(`the store holds ${JSON.stringify(held)}, not "${pageValue}"`);
  await waitForRow(page, KEY, `"${pageValue}"`, (c) => c.value === pageValue && c.exists === 'true');

  step('reloading: the watched key list survives');
  await page.reload({ waitUntil: 'load' });
  await waitForRow(page, KEY, `"${pageValue}" after a reload`, (c) => c.kind === 'sync' && c.value === pageValue);

  const lockName = `${KEY}-lock`;
  const lockUrl = (query) => new URL(`locks/${encodeURIComponent(lockName)}?${query}`, base);
  step(`watching ${lockName} as a lock: the page shows its holder and fencing token`);
  await page.getByLabel('Key to watch').fill(lockName);
  await page.getByLabel('as a lock (value = holder)').check();
  await page.getByRole('button', { name: 'Watch', exact: true }).click();
  await waitForRow(page, lockName, 'the lock as free', (c) => c.kind === 'sync' && c.marker === 'lock free');
  const acquired = await http('PUT', lockUrl(`holder=page-test-${token}&ttl=30s`));
  await expectStatus(acquired, [200], 'PUT /locks');
  const { fencing_token: fencingToken } = await acquired.json();
  await waitForRow(
    page,
    lockName,
    `the lock held by page-test-${token}`,
    (c) => c.marker === 'held by' && c.value === `page-test-${token}` && c.version === `fencing token ${fencingToken}`,
  );
  await expectStatus(await http('DELETE', lockUrl(`holder=page-test-${token}`)), [204], 'DELETE /locks');
  await waitForRow(page, lockName, 'the lock as free after its release', (c) => c.marker === 'lock free');
  await page.getByRole('button', { name: `Stop watching ${lockName}`, exact: true }).click();
  await page.locator('#rows tr').nth(1).waitFor({ state: 'detached', timeout: WAIT_MS });
  await browseAndSparkline(base, page);

  step('deleting through the page, then stopping the watch');
  await page.getByRole('button', { name: `Delete ${KEY} from the store`, exact: true }).click();
  await waitForRow(page, KEY, 'the key as absent after the page deleted it', (c) => c.exists === 'false');
  await page.getByRole('button', { name: `Stop watching ${KEY}`, exact: true }).click();
  await page.locator('#rows tr').first().waitFor({ state: 'detached', timeout: WAIT_MS });
  const state = await page.locator('#connection').getAttribute('data-state');
  if (state !== 'idle') fail(`with no key watched the connection state is ${state}, not idle`);

  if (problems.length > 0) fail(problems.join('\n'));
}

/** The key browser: list by glob, page, click to watch, sparkline. */
async function browseAndSparkline(base, page) {
  const keyUrl = (key) => new URL(`keys/${encodeURIComponent(key)}`, base);
  step(`writing ${LISTED.length + 1} keys under ui-list/ with fetch`);
  for (const key of [...LISTED, SPARK_KEY]) {
    await expectStatus(await http('PUT', keyUrl(key), { body: key === SPARK_KEY ? '19.5' : 'on' }), [200], `PUT ${key}`);
  }
  await expectStatus(await http('PUT', keyUrl('ui-other'), { body: 'x' }), [200], 'PUT ui-other');

  step('listing ui-list/* in the key browser, then its second page');
  await page.getByLabel('Keys matching').fill('ui-list/*');
  await page.getByRole('button', { name: 'List', exact: true }).click();
  const listed = () => page.evaluate(() => [...document.querySelectorAll('#browse-list button')].map((b) => b.dataset.key));
  await page.locator('#browse-status').filter({ hasText: 'more to list' }).waitFor({ timeout: WAIT_MS })
    .catch(async () => fail(`no first page with more to list: ${JSON.stringify(await listed())}`));
  const first = await listed();
  if (first.length !== 20) fail(`the first page lists ${first.length} keys, not 20: ${JSON.stringify(first)}`);
  await page.getByRole('button', { name: 'More keys', exact: true }).click();
  await page.locator('#browse-status').filter({ hasText: `${LISTED.length + 1} keys matching ui-list/*` })
    .waitFor({ timeout: WAIT_MS })
    .catch(async () => fail(`the second page did not complete the listing: ${JSON.stringify(await listed())}`));
  const all = await listed();
  const expected = [...LISTED, SPARK_KEY].sort();
  if (JSON.stringify([...all].sort()) !== JSON.stringify(expected)) {
    fail(`the browser lists ${JSON.stringify(all)}, not ${JSON.stringify(expected)}`);
  }
  if (!(await page.locator('#browse-more').isHidden())) fail('"More keys" is still offered after the last page');

  step(`clicking ${SPARK_KEY} watches it; numeric values draw a sparkline`);
  await page.getByRole('button', { name: `Watch ${SPARK_KEY}`, exact: true }).click();
  await waitForRow(page, SPARK_KEY, 'its value 19.5 after its first sync', (c) => c.kind === 'sync' && c.value === '19.5');
  const values = ['21', '20.25', '23', '22.5', '24.75'];
  for (const value of values) {
    await expectStatus(await http('PUT', keyUrl(SPARK_KEY), { body: value }), [200], `PUT ${value}`);
    await waitForRow(page, SPARK_KEY, `the value ${value}`, (c) => c.value === value);
  }
  const spark = await page.evaluate((key) => {
    const row = [...document.querySelectorAll('#rows tr')].find((tr) => tr.dataset.key === key);
    const svg = row?.querySelector('svg.spark');
    if (!svg) return null;
    const box = svg.getBoundingClientRect();
    const hidden = svg.hasAttribute('hidden') || box.width === 0 || box.height === 0;
    return { hidden, points: svg.querySelector('polyline').getAttribute('points') };
  }, SPARK_KEY);
  const points = (spark?.points ?? '').trim().split(/\s+/).filter(Boolean);
  if (!spark || spark.hidden || points.length !== values.length + 1) {
    fail(`the sparkline shows ${JSON.stringify(spark)}, not ${values.length + 1} points`);
  }
  // The highest value (24.75, the last) is at the top, the lowest (19.5, the first) at the bottom.
  const ys = points.map((point) => Number(point.split(',')[1]));
  if (!(ys[0] === Math.max(...ys) && ys[ys.length - 1] === Math.min(...ys))) fail(`sparkline points ${spark.points} do not follow the values`);

  if (SCREENSHOT) {
    await mkdir(path.dirname(SCREENSHOT), { recursive: true });
    await page.setViewportSize({ width: 1100, height: 800 });
    await page.screenshot({ path: SCREENSHOT, fullPage: true, timeout: 10_000 });
    step(`screenshot written to ${SCREENSHOT}`);
  }

  step(`stopping the watch of ${SPARK_KEY} and deleting the listed keys`);
  await page.getByRole('button', { name: `Stop watching ${SPARK_KEY}`, exact: true }).click();
  await page.locator(`#rows tr[data-key="${SPARK_KEY}"]`).waitFor({ state: 'detached', timeout: WAIT_MS });
  for (const key of [...LISTED, SPARK_KEY, 'ui-other']) {
    await expectStatus(await http('DELETE', keyUrl(key)), [204], `DELETE ${key}`);
  }
}

async function main() {
  const problems = [];
  const session = {};
  let timer;
  const overall = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new TestFailure(`the test did not finish within ${OVERALL_MS / 1000} s`)), OVERALL_MS);
  });
  try {
    const base = parseBase(process.argv[2]);
    await Promise.race([run(base, problems, session), overall]);
    step('passed');
    return 0;
  } catch (err) {
    console.error(`ui test FAILED: ${err instanceof TestFailure ? err.message : err.stack}`);
    if (problems.length > 0) console.error(`ui test: page problems:\n  ${problems.join('\n  ')}`);
    if (session.page) {
      try {
        const dir = await mkdtemp(path.join(tmpdir(), 'ui-test-failure-'));
        const file = path.join(dir, 'page.png');
        await session.page.screenshot({ path: file, fullPage: true, timeout: 5_000 });
        console.error(`ui test: screenshot of the page: ${file}`);
      } catch (shotErr) {
        console.error(`ui test: no screenshot: ${shotErr.message}`);
      }
    }
    return 1;
  } finally {
    clearTimeout(timer);
    await session.context?.close().catch(() => {});
    if (session.userDataDir) await rm(session.userDataDir, { recursive: true, force: true }).catch(() => {});
  }
}

process.exitCode = await main();
