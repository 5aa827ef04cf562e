// One exchange of an AI SDK chat with a serve, through the `ai` package's own chat
// (AbstractChat, as useChat drives it) and DefaultChatTransport (tests/test_ui_aisdk.py,
// through driver.mjs). Given {api, token, chatId, messages, session?, prompt?, approvals?,
// outputs?, reconnect?, dropAfter?}: sends the prompt, or answers with
// addToolApprovalResponse / addToolOutput and sends, or reconnects (resumeStream).
// `session` keeps the chat for the next exchange naming it (then `messages` is not used,
// and `api` is where its transport goes from now on);
// `dropAfter` cuts this exchange's stream once its text holds that string, as a network
// failure would (the connection closed, the chat told "network error"). Gives {parts,
// invalid, messages, status, error}: every part of the streams read (each checked against
// the package's own chunk schema) and the chat's state once the exchange is done; sends a
// progress "streaming" once a stream is open.
import {
  AbstractChat,
  DefaultChatTransport,
  parseJsonEventStream,
  uiMessageChunkSchema,
} from "ai";

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

// `stream`, ended with a network error by the first read after its text held `marker`.
function cutAfter(stream, marker) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let seen = "";
  let cut = false;
  return new ReadableStream({
    async pull(controller) {
      if (cut) {
        await reader.cancel();
        controller.error(new TypeError("network error"));
        return;
      }
      const { done, value } = await reader.read();
      if (done) return controller.close();
      controller.enqueue(value);
      seen += decoder.decode(value, { stream: true });
      cut = seen.includes(marker);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
}

const sessions = new Map();

function newChat(given) {
  // Reads what the exchange under way records (chat.exchange) at each request.
  async function recording(url, init) {
    const response = await fetch(url, init);
    if (!response.body || response.status !== 200) return response;
    const current = chat.exchange;
    current.progress("streaming");
    let [mine, theirs] = response.body.tee();
    if (current.dropAfter) {
      [mine, theirs] = [cutAfter(mine, current.dropAfter), cutAfter(theirs, current.dropAfter)];
      current.dropAfter = null;
    }
    current.readers.push(
      (async () => {
        const stream = parseJsonEventStream({ stream: mine, schema: uiMessageChunkSchema() });
        try {
          for await (const result of stream) {
            if (result.success) current.parts.push(result.value);
            else current.invalid.push(String(result.error));
          }
        } catch (exc) {
          current.dropped = String(exc?.message ?? exc);
        }
      })(),
    );
    return new Response(theirs, { status: response.status, headers: response.headers });
  }
  const chat = new Chat({
    id: given.chatId,
    messages: given.messages ?? [],
    transport: new DefaultChatTransport({
      api: given.api,
      headers: given.token ? { Authorization: `Bearer ${given.token}` } : {},
      fetch: recording,
    }),
    onError(exc) {
      chat.exchange.error = String(exc?.message ?? exc);
    },
  });
  return chat;
}

export async function chatExchange(given, progress) {
  let chat = given.session ? sessions.get(given.session) : undefined;
  if (!chat) {
    chat = newChat(given);
    if (given.session) sessions.set(given.session, chat);
  } else if (given.api) {
    chat.transport.api = given.api; // the same chat, against a restarted server
  }
  const exchange = { parts: [], invalid: [], readers: [], error: null, progress };
  exchange.dropAfter = given.dropAfter ?? null;
  chat.exchange = exchange;
  if (given.prompt !== undefined) {
    await chat.sendMessage({ text: given.prompt });
  } else if (given.reconnect) {
    await chat.resumeStream();
  } else {
    for (const answer of given.approvals ?? []) await chat.addToolApprovalResponse(answer);
    for (const output of given.outputs ?? []) await chat.addToolOutput(output);
    await chat.sendMessage();
  }
  await Promise.all(exchange.readers);
  return {
    parts: exchange.parts,
    invalid: exchange.invalid,
    messages: chat.messages,
    status: chat.status,
    error: exchange.error,
  };
}
