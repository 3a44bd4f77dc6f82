import { render } from 'preact';
import { App } from './app';
import { installShellHooks } from './shell';
import './style.css';

installShellHooks();
render(<App />, document.getElementById('app')!);
