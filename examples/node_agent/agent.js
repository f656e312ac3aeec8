#!/usr/bin/env node
// The calculator agent of recipes/calc/ in Node.js, with nothing alight-specific in it: it reads
// the task (a Calc-X-style row) as JSON on stdin, talks to the model with plain `fetch` at
// OPENAI_BASE_URL/chat/completions (OPENAI_API_KEY, ALIGHT_MODEL), runs the `calculate` tool the
// model asks for, and prints its reward as the last line of stdout: {"reward": 1} when the answer
// is the task's `result`. Run by `alight dev configs/calc_node.yaml` or `alight train` with it.
"use strict";

const MAX_TURNS = 3; // model calls per task: tool call(s), then the answer
const CALCULATE_TOOL = {
  type: "function",
  function: {
    name: "calculate",
    description:
      "Evaluate arithmetic with + - * / and parentheses. Write numbers, or a, b, c, ... for the" +
      " numbers of the question in order. Then answer with the number, or with 'Done.' to submit" +
      " the result.",
    parameters: {
      type: "object",
      properties: { expression: { type: "string", description: "e.g. 47+12*6 or a+b*c" } },
      required: ["expression"],
    },
  },
};

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

async function chat(messages) {
  const response = await fetch(`${process.env.OPENAI_BASE_URL}/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${process.env.OPENAI_API_KEY}` },
    body: JSON.stringify({ model: process.env.ALIGHT_MODEL, messages, tools: [CALCULATE_TOOL] }),
  });
  if (!response.ok) throw new Error(`the model answered HTTP ${response.status}: ${await response.text()}`);
  return (await response.json()).choices[0].message;
}

function questionNumbers(question) {
  const names = {};
  (question.match(/\d+(?:\.\d+)?/g) || []).slice(0, 26).forEach((value, i) => {
    names[String.fromCharCode(97 + i)] = Number(value);
  });
  return names;
}

// A small recursive-descent parser: numbers, the question's names, + - * /, parentheses. No model
// output is ever run as code.
function calculate(expression, names) {
  const tokens = expression.match(/\d+(?:\.\d+)?|[a-z]|[-+*/()]|\S/g) || [];
  let at = 0;
  const peek = () => tokens[at];
  const take = () => tokens[at++];
  function primary() {
    const token = take();
    if (token === undefined) throw new Error("unexpected end");
    if (token === "(") {
      const value = sum();
      if (take() !== ")") throw new Error("missing )");
      return value;
    }
    if (token === "-" || token === "+") return token === "-" ? -primary() : primary();
    if (/^\d/.test(token)) return Number(token);
    if (/^[a-z]$/.test(token) && token in names) return names[token];
    throw new Error(`unexpected ${JSON.stringify(token)}`);
  }
  function product() {
    let value = primary();
    while (peek() === "*" || peek() === "/") value = take() === "*" ? value * primary() : value / primary();
    return value;
  }
  function sum() {
    let value = product();
    while (peek() === "+" || peek() === "-") value = take() === "+" ? value + product() : value - product();
    return value;
  }
  try {
    if (expression.length > 200) return "error: expression too long";
    const value = sum();
    if (at !== tokens.length) return "error: not an arithmetic expression";
    if (!Number.isFinite(value)) return "error: result is not a finite number";
    return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(6)));
  } catch (err) {
    return `error: ${err.message}`;
  }
}

function runToolCall(call, names) {
  if (call.function.name !== "calculate") return `error: unknown tool ${JSON.stringify(call.function.name)}`;
  let args;
  try {
    args = JSON.parse(call.function.arguments);
  } catch {
    return "error: arguments are not JSON";
  }
  if (!args || typeof args.expression !== "string") return "error: expected {'expression': string}";
  return calculate(args.expression, names);
}

function score(text, result) {
  const numbers = text.replace(/(?<=\d)[,_](?=\d{3})/g, "").match(/-?\d+(?:\.\d+)?/g);
  if (!numbers) return 0;
  const expected = Number(String(result).replace(/[,_]/g, ""));
  return Math.abs(Number(numbers[numbers.length - 1]) - expected) < 1e-6 ? 1 : 0;
}

async function main() {
  const task = JSON.parse(await readStdin());
  const names = questionNumbers(task.question);
  const messages = [{ role: "user", content: task.question }];
  let lastResult = null;
  for (let turn = 0; turn < MAX_TURNS; turn++) {
    const message = await chat(messages);
    if (!message.tool_calls || message.tool_calls.length === 0) {
      let answer = message.content || "";
      if (lastResult !== null && !lastResult.startsWith("error") && !/\d/.test(answer)) answer = lastResult;
      return score(answer, task.result);
    }
    messages.push({ role: "assistant", content: message.content || "", tool_calls: message.tool_calls });
    for (const call of message.tool_calls) {
      lastResult = runToolCall(call, names);
      messages.push({ role: "tool", tool_call_id: call.id, content: lastResult });
    }
  }
  return 0;
}

main().then(
  (reward) => console.log(JSON.stringify({ reward })),
  (err) => {
    console.error(`calc agent failed: ${err.stack || err}`);
    process.exit(1);
  },
);
