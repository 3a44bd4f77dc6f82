// Images attached to a message: files (picked, dropped or pasted) -> data URLs -> OpenAI content parts.

import { splitThinking } from './markdown';
import type { StoredMessage } from './conversation';
import type { ContentPart, RequestMessage } from './generated';

export const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];
/** Larger images are refused rather than sent: the request body and storage would grow too large. */
export const MAX_IMAGE_BYTES = 20 * 1024 * 1024;

export interface Attachment {
  name: string;
  type: string;
  size: number;
  /** `data:image/...;base64,...` */
  url: string;
}

export function isImage(file: { type: string }): boolean {
  return IMAGE_TYPES.includes(file.type);
}

/** Reads a file as a data URL. */
export function readAsDataUrl(file: Blob): Promise<string> {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error ?? new Error('Could not read the file'));
    reader.readAsDataURL(file);
  });
}

/** Turns files into attachments; files that are not images, or too large, are reported, not thrown. */
export async function attach(files: Iterable<File>): Promise<{ attachments: Attachment[]; rejected: string[] }> {
  const attachments: Attachment[] = [];
  const rejected: string[] = [];
  for (const file of files) {
    if (!isImage(file)) {
      rejected.push(`${file.name || 'file'}: not an image (PNG, JPEG, GIF or WebP)`);
      continue;
    }
    if (file.size > MAX_IMAGE_BYTES) {
      rejected.push(`${file.name || 'image'}: larger than ${MAX_IMAGE_BYTES / (1024 * 1024)} MiB`);
      continue;
    }
    attachments.push({ name: file.name || 'pasted image', type: file.type, size: file.size, url: await readAsDataUrl(file) });
  }
  return { attachments, rejected };
}

/** A user turn's content: plain text, or the images (as `image_url` parts) followed by the text. */
export function userContent(text: string, images: string[] = []): string | ContentPart[] {
  if (images.length === 0) return text;
  const parts: ContentPart[] = images.map((url) => ({ type: 'image_url', image_url: { url } }));
  if (text) parts.push({ type: 'text', text });
  return parts;
}

/**
 * The messages sent for a conversation: system prompt first, each user turn with its images, each assistant
 * turn as its answer (without its `<think>` block). Assistant turns that failed or are empty are left out.
 */
export function toApiMessages(messages: StoredMessage[], system?: string): RequestMessage[] {
  const out: RequestMessage[] = [];
  if (system && system.trim()) out.push({ role: 'system', content: system.trim() });
  for (const m of messages) {
    if (m.role === 'user') {
      out.push({ role: 'user', content: userContent(m.content, m.images) });
    } else if (m.role === 'assistant') {
      const answer = splitThinking(m.content).answer;
      if (!answer.trim()) continue;
      out.push({ role: 'assistant', content: answer });
    } else {
      out.push({ role: 'system', content: m.content });
    }
  }
  return out;
}
