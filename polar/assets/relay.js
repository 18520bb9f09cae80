// The in-container half of the Docker runtime's gateway tunnel (polar/runtime/tunnel.py is the host half).
//
//   node relay.js SOCKET PORT READY_FILE
//
// Listens on 127.0.0.1:PORT inside a container that has no network (only lo) and pipes every connection to
// the Unix socket SOCKET, which the host bind-mounts and forwards to the gateway. It reaches nothing else.
// READY_FILE is written once the port listens.
"use strict";
const net = require("net");
const fs = require("fs");

const [socketPath, port, readyFile] = process.argv.slice(2);
const server = net.createServer((client) => {
  const upstream = net.connect(socketPath);
  client.pipe(upstream);
  upstream.pipe(client);
  const close = () => {
    client.destroy();
    upstream.destroy();
  };
  client.on("error", close);
  upstream.on("error", close);
  client.on("close", close);
  upstream.on("close", close);
});
server.on("error", (err) => {
  process.stderr.write(`relay: ${err.message}\n`);
  process.exit(1);
});
server.listen(Number(port), "127.0.0.1", () => fs.writeFileSync(readyFile, String(process.pid)));
