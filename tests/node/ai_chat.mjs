// One exchange of an AI SDK chat with a serve, through the `ai` package's own chat
// (AbstractChat, as useChat drives it) and DefaultChatTransport (tests/test_ui_aisdk.py).
// Reads {api, token, chatId, messages, prompt?, approvals?, outputs?, reconnect?} as JSON on
// stdin: sends the prompt, or answers with addToolApprovalResponse / addToolOutput and
// sends, or reconnects (resumeStream). Prints {parts, messages, status, error} as JSON:
// every part of the streams it read (each checked against the package's own chunk
// schema) and the chat's state once it is done.
import {
  AbstractChat,
  DefaultChatTransport,
  parseJsonEventStream,
  uiMessageChunkSchema,
} from "ai";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const given = JSON.parse(Buffer.concat(chunks).toString("utf8"));

class State {
  constructor(messages) {
    this.status = "ready";
    this.error = undefined;
    this.messages = messages;
  }
  pushMessage(message) {
    this.messages = this.messages.concat(message);
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    this.messages = [...this.messages.slice(0, index), message, ...this.messages.slice(index + 1)];
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class Chat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new State(init.messages ?? []) });
  }
}

// Every stream the chat reads is read here too, part by part, through the schema.
const parts = [];
const invalid = [];
async function recording(url, init) {
  const response = await fetch(url, init);
  if (!response.body || response.status !== 200) return response;
  const [mine, theirs] = response.body.tee();
  const reading = (async () => {
    const stream = parseJsonEventStream({ stream: mine, schema: uiMessageChunkSchema() });
    for await (const result of stream) {
      if (result.success) parts.push(result.value);
      else invalid.push(String(result.error));
    }
  })();
  readers.push(reading);
  return new Response(theirs, { status: response.status, headers: response.headers });
}
const readers = [];

let error = null;
const chat = new Chat({
  id: given.chatId,
  messages: given.messages ?? [],
  transport: new DefaultChatTransport({
    api: given.api,
    headers: given.token ? { Authorization: `Bearer ${given.token}` } : {},
    fetch: recording,
  }),
  onError(exc) {
    error = String(exc?.message ?? exc);
  },
});

if (given.prompt !== undefined) {
  await chat.sendMessage({ text: given.prompt });
} else if (given.reconnect) {
  await chat.resumeStream();
} else {
  for (const answer of given.approvals ?? []) await chat.addToolApprovalResponse(answer);
  for (const output of given.outputs ?? []) await chat.addToolOutput(output);
  await chat.sendMessage();
}
await Promise.all(readers);
process.stdout.write(
  JSON.stringify({ parts, invalid, messages: chat.messages, status: chat.status, error }),
);
