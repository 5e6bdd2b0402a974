// Preloaded into server-everything with `node --import`: its streamableHttp
// transport calls app.listen(PORT) on every interface and has no host option.
// This forces every TCP listener of the process onto 127.0.0.1 and, when
// CONFORMANCE_PORT_FILE is set, writes the port actually bound there (so
// PORT=0 gives a free random port without a race).
import fs from "node:fs";
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const first = args[0];
  if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
    const cb = args.find((a) => typeof a === "function");
    args = [{ port: Number(first), host: "127.0.0.1" }];
    if (cb) args.push(cb);
  } else if (first && typeof first === "object" && first.path === undefined && first.fd === undefined && first.handle === undefined && !(first instanceof net.Server)) {
    args[0] = { ...first, host: "127.0.0.1" };
  }
  const portFile = process.env.CONFORMANCE_PORT_FILE;
  if (portFile) {
    this.once("listening", () => {
      const addr = this.address();
      if (addr && typeof addr === "object") {
        fs.writeFileSync(portFile + ".tmp", `${addr.port}\n`);
        fs.renameSync(portFile + ".tmp", portFile);
      }
    });
  }
  return listen.apply(this, args);
};
