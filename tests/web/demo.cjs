// The web demo in headless Chromium (WebGPU; SwiftShader on a machine without a GPU), driven by Playwright:
// loads the page with a scripted run (fetch a model folder, generate greedily, train), waits for the outcome the
// page publishes, and checks it: the generated ids equal the native CLI's, and the training loss falls.
//
//   node tests/web/demo.cjs URL EXPECTED_IDS_JSON TRAIN_STEPS [SCREENSHOT.png]
//
// With $PICK_FILES (paths separated by commas) the page is expected to open its file picker (`pick=1`), and
// those files are given to it. With TRAIN_STEPS 0 only the generation is checked. With $NO_WEBGPU=1 Chromium runs
// without WebGPU, and the page must say so (in the page, not only in the console).
// playwright-core is found through NODE_PATH; Chromium at $CHROMIUM (default /usr/bin/chromium), with the extra
// flags in $CHROMIUM_ARGS.
const { chromium } = require('playwright-core');

async function main() {
  const [url, expectedJson, trainSteps, screenshot] = process.argv.slice(2);
  const expected = JSON.parse(expectedJson);
  const steps = Number(trainSteps);
  const noWebGpu = process.env.NO_WEBGPU === '1';
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: [
      ...(noWebGpu ? [] : ['--enable-unsafe-webgpu']),
      // Without a GPU, the default compositor loses the SwiftShader WebGPU device as soon as the canvas is
      // configured ("A valid external Instance reference no longer exists"); Vulkan throughout keeps it.
      '--enable-features=Vulkan',
      '--use-angle=vulkan',
      '--use-vulkan=swiftshader',
      '--no-sandbox',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      ...(process.env.CHROMIUM_ARGS || '').split(' ').filter(Boolean),
    ],
  });
  const page = await browser.newPage({ viewport: { width: 1100, height: 1000 } });
  const log = [];
  page.on('console', (m) => log.push(`[${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => log.push(`[pageerror] ${e.message}`));
  try {
    const picked = process.env.PICK_FILES ? process.env.PICK_FILES.split(',') : null;
    // While the page load still counts as a user activation, rfd opens the browser's file chooser, which
    // Playwright answers; later it shows its own overlay, whose input gets the files. One or the other happens.
    const chooser = picked && page.waitForEvent('filechooser', { timeout: 0 });
    await page.goto(url);
    if (picked) {
      const overlay = page.waitForSelector('#rfd-overlay', { state: 'visible', timeout: 0 });
      const how = await Promise.race([chooser.then((c) => ['chooser', c]), overlay.then(() => ['overlay'])]);
      if (how[0] === 'chooser') await how[1].setFiles(picked);
      else await page.setInputFiles('#rfd-input', picked);
      chooser.catch(() => {});
      overlay.catch(() => {});
      console.log(`picked ${picked.length} files through the ${how[0]}`);
    }
    const handle = await page.waitForFunction(
      () => document.getElementById('hierarchos-result')?.textContent || null,
      null,
      { timeout: 15 * 60 * 1000, polling: 1000 },
    );
    const result = JSON.parse(await handle.jsonValue());
    if (screenshot) await page.screenshot({ path: screenshot });
    if (noWebGpu) {
      const shown = await page.locator('#status').textContent();
      if (!String(result.error).includes('No WebGPU adapter') || !shown.includes('No WebGPU adapter')) {
        throw new Error(`without WebGPU the page should say so; it shows "${shown}", reports ${JSON.stringify(result)}`);
      }
      console.log(`ok (no WebGPU): the page shows "${shown}"`);
      return;
    }
    console.log(`web demo on "${result.adapter}": ${JSON.stringify(result)}`);
    const failures = [];
    if (result.error) failures.push(`the page reported an error: ${result.error}`);
    if (JSON.stringify(result.ids) !== JSON.stringify(expected)) {
      failures.push(`generated ids ${JSON.stringify(result.ids)} differ from the native CLI's ${JSON.stringify(expected)}`);
    }
    const losses = result.losses || [];
    if (losses.length !== steps) failures.push(`${losses.length} training losses, expected ${steps}`);
    const head = losses.slice(0, 2).reduce((a, b) => a + b, 0) / 2;
    const tail = losses.slice(-2).reduce((a, b) => a + b, 0) / 2;
    if (steps > 0 && !(tail < head)) failures.push(`the loss did not fall: first two ${head}, last two ${tail}`);
    if (failures.length) {
      console.error(log.join('\n'));
      throw new Error(failures.join('\n'));
    }
    const trained = steps > 0 ? `; loss ${losses[0].toFixed(4)} -> ${losses[steps - 1].toFixed(4)} in ${steps} steps` : '';
    console.log(`ok (${result.model}): ${result.ids.length} tokens equal the CLI's${trained}`);
  } catch (e) {
    if (!String(e).includes('differ') && !String(e).includes('loss')) console.error(log.join('\n'));
    throw e;
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(`web demo test failed: ${e.message || e}`);
  process.exit(1);
});
