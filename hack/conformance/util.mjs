// Small helpers for hack/conformance.sh, run with the pinned Node.
//   node util.mjs free-ports N          print N distinct free TCP ports on 127.0.0.1
//   node util.mjs http-status URL       print the HTTP status of GET URL (000 on error), 2 s timeout
import net from "node:net";

const [cmd, arg] = process.argv.slice(2);

async function freePorts(n) {
  const servers = [];
  const ports = [];
  for (let i = 0; i < n; i++) {
    const s = net.createServer();
    await new Promise((res, rej) => { s.once("error", rej); s.listen(0, "127.0.0.1", res); });
    servers.push(s);
    ports.push(s.address().port);
  }
  await Promise.all(servers.map((s) => new Promise((res) => s.close(res))));
  console.log(ports.join(" "));
}

async function httpStatus(url) {
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(2000) });
    await r.body?.cancel();
    console.log(String(r.status));
  } catch {
    console.log("000");
  }
}

if (cmd === "free-ports") await freePorts(Number(arg || 1));
else if (cmd === "http-status") await httpStatus(arg);
else { console.error(`unknown command ${cmd}`); process.exit(2); }
