// The protocols' own clients, driven by the tests over stdin (tests/ui_app.py, NodeClients):
// one node process for a whole test, so node starts and loads the npm packages once, not
// once per exchange. Each stdin line is a JSON command {op: "agui" | "chat", ...}; each
// command is answered, in order, by one stdout line {reply: ...} or {failed: "..."}, after
// any {progress: ...} lines it sends while it works. The packages are loaded on first use.
import { createInterface } from "node:readline";

const ops = {
  agui: async () => (await import("./agui_client.mjs")).aguiRun,
  chat: async () => (await import("./ai_chat.mjs")).chatExchange,
};
const loaded = new Map();

function say(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
  if (!line.trim()) continue;
  try {
    const { op, ...given } = JSON.parse(line);
    if (!(op in ops)) throw new Error(`unknown op ${JSON.stringify(op)}`);
    if (!loaded.has(op)) loaded.set(op, await ops[op]());
    say({ reply: await loaded.get(op)(given, (progress) => say({ progress })) });
  } catch (exc) {
    say({ failed: String(exc?.stack ?? exc) });
  }
}
